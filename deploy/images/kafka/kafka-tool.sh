#!/bin/bash
# Kafka's command-line tools in the stand-in Kafka image, under the names and at the place
# apache/kafka has them (/opt/kafka/bin/kafka-topics.sh, ...): the image links each name to this
# one script, which runs the tool's main class from the broker's own jars. docker-compose.yml's
# health check calls kafka-broker-api-versions.sh. The tools log warnings only, to standard
# error; their heap is KAFKA_HEAP_OPTS (default -Xmx256m) and KAFKA_OPTS is added last.
set -euo pipefail

case "${0##*/}" in
  kafka-broker-api-versions.sh) main=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
  kafka-topics.sh) main=org.apache.kafka.tools.TopicCommand ;;
  kafka-console-producer.sh) main=org.apache.kafka.tools.ConsoleProducer ;;
  kafka-console-consumer.sh) main=org.apache.kafka.tools.consumer.ConsoleConsumer ;;
  kafka-consumer-groups.sh) main=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
  kafka-get-offsets.sh) main=org.apache.kafka.tools.GetOffsetShell ;;
  kafka-metadata-quorum.sh) main=org.apache.kafka.tools.MetadataQuorumCommand ;;
  kafka-storage.sh) main=kafka.tools.StorageTool ;;
  *)
    echo "${0##*/}: not one of the Kafka tools of this image (ls /opt/kafka/bin)" >&2
    exit 2
    ;;
esac

home=/opt/kafka
# shellcheck disable=SC2086  # each variable holds several JVM options
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} \
  "-Dlog4j2.configurationFile=$home/config/tools-log4j2.properties" ${KAFKA_OPTS:-} \
  -cp "$home/libs/*" "$main" "$@"
