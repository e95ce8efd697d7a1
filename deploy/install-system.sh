#!/usr/bin/env bash
# Debian packages skewer needs: Redis, Prometheus, a Java 17 JDK and Maven (Maven assembles
# Kafka's classpath and Spark's Kafka source from Maven Central; the JDK's javac compiles the
# real-time workers' writer, jvm/realtime-writer), and Python's venv module.
#
# With arguments COMMAND=PACKAGE ..., it installs only those packages whose command is missing,
# the same way (`skewer services up --docker` asks for dockerd=docker.io).
#
# Idempotent: when every command is already on PATH it does nothing, not even `apt-get update`.
# The packages' own daemons are never started: a policy-rc.d that answers 101 ("action
# forbidden") is in place during the install, and skewer runs its own processes bound to
# 127.0.0.1 (pipeline/services/).
set -euo pipefail

# redis-server also runs Redis Sentinel (`redis-server CONF --sentinel`, `services up
# --redis-sentinel`): Debian's redis-sentinel package only adds a link to it and a unit.
declare -A package_of=(
  [redis-server]=redis-server
  [prometheus]=prometheus
  [java]=openjdk-17-jre-headless
  [javac]=openjdk-17-jdk-headless
  [mvn]=maven
)

commands=(redis-server prometheus java javac mvn)
if [ "$#" -gt 0 ]; then
  package_of=()
  commands=()
  for pair in "$@"; do
    if [[ "$pair" != ?*=?* ]]; then
      echo "usage: $0 [COMMAND=PACKAGE ...]" >&2
      exit 2
    fi
    package_of[${pair%%=*}]=${pair#*=}
    commands+=("${pair%%=*}")
  done
fi

# root's PATH has the sbin folders (dockerd is in /usr/sbin); a user's may not.
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
missing=()
for command_name in "${commands[@]}"; do
  if ! command -v "$command_name" >/dev/null 2>&1; then
    missing+=("${package_of[$command_name]}")
  fi
done
# Debian's own python3 creates virtualenvs only with python3-venv installed (not a question
# when only some packages are asked for).
if [ "$#" -eq 0 ]; then
  python=$(command -v python3.11 || command -v python3 || true)
  if [ -z "$python" ]; then
    missing+=(python3 python3-venv)
  elif ! "$python" -c "import ensurepip, venv" >/dev/null 2>&1; then
    missing+=(python3-venv)
  fi
fi
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

sudo_prefix=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_prefix=(sudo)
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_prefix[@]}" tee "$policy" >/dev/null
  "${sudo_prefix[@]}" chmod 755 "$policy"
  created_policy=1
fi
remove_policy() {
  if [ "$created_policy" -eq 1 ]; then
    "${sudo_prefix[@]}" rm -f "$policy"
  fi
}
trap remove_policy EXIT

echo "skewer: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_prefix[@]}" apt-get update -qq
"${sudo_prefix[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
