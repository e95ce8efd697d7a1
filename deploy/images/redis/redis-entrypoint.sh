#!/bin/sh
# The stand-in Redis image's entrypoint. Arguments that start with "-" are options of
# redis-server. A redis-server started without a config file gets `--protected-mode no` first
# (the official image builds Redis with that default): with Docker, clients come from another
# container or through a published port, never from the loopback address protected mode
# admits. Options given after it, or in the config file, still win.
set -eu

case "${1:-}" in
  -*) set -- redis-server "$@" ;;
esac
if [ "${1:-}" = redis-server ]; then
  shift
  case "${1:-}" in
    "" | -*) set -- redis-server --protected-mode no "$@" ;;
    *) set -- redis-server "$@" ;;
  esac
fi
exec "$@"
