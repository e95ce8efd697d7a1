#!/bin/bash
# Prints the broker's server.properties from the environment, the way Apache's apache/kafka
# image reads docker-compose.yml's `environment:` (the stand-in image's kafka-run calls it).
#
# Each variable KAFKA_<NAME> is one property: NAME lower-cased, then "___" -> "-", "__" -> "_"
# and "_" -> ".", so KAFKA_NODE_ID is node.id, KAFKA_LISTENER_SECURITY_PROTOCOL_MAP is
# listener.security.protocol.map and KAFKA_LISTENER_NAME_INTERNAL_SASL_ENABLED__MECHANISMS is
# listener.name.internal.sasl.enabled_mechanisms. Variables that set up the JVM rather than the
# broker are not properties: KAFKA_*_OPTS (KAFKA_HEAP_OPTS, KAFKA_OPTS, ...), KAFKA_JMX_*,
# KAFKA_LOG4J_* and KAFKA_TOOLS_*. CLUSTER_ID has no KAFKA_ prefix and is not a property either
# (the storage is formatted with it). One line per property, sorted by variable name; nothing
# at all when no variable names a property.
set -euo pipefail

while IFS= read -r name; do
  case "$name" in
    KAFKA_OPTS | KAFKA_*_OPTS | KAFKA_JMX_* | KAFKA_LOG4J_* | KAFKA_TOOLS_*) continue ;;
    KAFKA_?*) ;;
    *) continue ;;
  esac
  key=${name#KAFKA_}
  key=${key,,}
  key=${key//___/-}
  key=${key//__/+}
  key=${key//_/.}
  key=${key//+/_}
  printf '%s=%s\n' "$key" "${!name}"
done < <(compgen -e | LC_ALL=C sort)
