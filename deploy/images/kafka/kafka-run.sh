#!/bin/bash
# The stand-in Kafka image's command: one KRaft node configured by its environment, as
# apache/kafka is (docker-compose.yml's kafka and kafka-1..3 services).
#
# - server.properties is written from the KAFKA_* variables (env-to-properties.sh); with none,
#   the image's default-server.properties (one combined broker and controller on :9092/:9093).
# - The storage is formatted once with CLUSTER_ID (a fresh id when unset), the same call as the
#   native broker's (pipeline/services/kafka_broker.py); a formatted log folder is kept.
# - Then the JVM replaces this script as the container's first process, so `docker stop`'s
#   SIGTERM reaches the broker and it shuts down cleanly.
#
# JVM settings, all optional: KAFKA_HEAP_OPTS (default the native broker's -Xms256m -Xmx768m),
# KAFKA_JVM_PERFORMANCE_OPTS (default G1 with 20 ms pauses) and KAFKA_OPTS (added last).
set -euo pipefail

home=/opt/kafka
config=$home/config/server.properties
classpath="$home/libs/*"
log4j="-Dlog4j2.configurationFile=$home/config/log4j2.properties"

"$home/bin/env-to-properties.sh" > "$config"
if [ ! -s "$config" ]; then
  cp "$home/config/default-server.properties" "$config"
fi

cluster_id=${CLUSTER_ID:-}
if [ -z "$cluster_id" ]; then
  cluster_id=$(java "$log4j" -cp "$classpath" kafka.tools.StorageTool random-uuid)
fi
java "$log4j" -cp "$classpath" kafka.tools.StorageTool format \
  --cluster-id "$cluster_id" --config "$config" --ignore-formatted

# Word splitting of the option variables is wanted: each holds several JVM options.
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} \
  ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true} \
  "$log4j" ${KAFKA_OPTS:-} -cp "$classpath" kafka.Kafka "$config"
