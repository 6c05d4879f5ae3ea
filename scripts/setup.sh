#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, the Python venv, the JVM jars.
# Each step is skipped when its inputs have not changed (stamp files under .stamps/), so
# `make demo` and `make test` cost nothing extra once the machine is set up.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .stamps

log() { printf '[setup] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------
# java + mvn: the broker, Spark and the jar fetch; postgresql: the ledger tests;
# chromium: the Dagster UI browser test. Installed only when missing.
need=()
command -v java >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v python3 >/dev/null || need+=(python3 python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- Python venv -----------------------------------------------------------------------
PY=${PYTHON:-python3}
py_hash=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -x .venv/bin/python ] || [ "$(cat .stamps/venv 2>/dev/null)" != "$py_hash" ]; then
  log "creating .venv and installing pinned Python dependencies"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip==25.3
  .venv/bin/pip install -q -e '.[test]'
  echo "$py_hash" > .stamps/venv
fi

# --- JVM jars from Maven Central ------------------------------------------------------
# hadoop-aws (s3a) must match the Hadoop classes Spark runs: read their version from the
# hadoop-client-api jar of the pyspark just installed, never from a guess in the pom.
hadoop_version=$(.venv/bin/python -c 'from resources.jvm.jars import pyspark_hadoop_version; print(pyspark_hadoop_version())')
jvm_hash=$( (cat jvm/pom.xml jvm/*/pom.xml jvm/settings.xml; echo "$hadoop_version") | sha256sum | cut -c1-16)
if [ ! -d .jars/spark ] || [ "$(cat .stamps/jars 2>/dev/null)" != "$jvm_hash" ]; then
  log "fetching JVM jars with mvn into .jars/ (hadoop-aws $hadoop_version, as pyspark's Hadoop)"
  rm -rf .jars
  mvn -B -q -s jvm/settings.xml -f jvm/pom.xml -Dhadoop.version="$hadoop_version" \
    dependency:copy-dependencies
  echo "$jvm_hash" > .stamps/jars
fi

# --- Class-data archives for the Spark driver (resources/jvm/class_archive.py) ----------
# Written once per JDK and classpath (the file name says which), so a driver starts ~3 s
# sooner; skipped in a second when they are there.
.venv/bin/python -m resources.jvm.class_archive

# --- Bytecode of the project's own modules -----------------------------------------------
# The installed packages were compiled by pip; the project's modules (an editable install)
# are compiled by the first import that may write them. A shell with PYTHONDONTWRITEBYTECODE
# set (as some CI images and this project's machines have) never writes them, and every
# `exactly` process, Dagster run and test child then compiled ~300 modules again: a tenth of
# a short process's start. Compiled here once; a no-op when they are current.
.venv/bin/python -m compileall -q -j 0 exactly_cli jobs ledger resources orchestration \
  pipelines bench tests > /dev/null
