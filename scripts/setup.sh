#!/usr/bin/env bash
# Build both virtualenvs and check system tools. Idempotent: a venv is only (re)installed when the hash
# of its requirements (+ pyproject.toml) differs from the stamp stored inside it.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}

die() { echo "setup: ERROR: $*" >&2; exit 1; }
say() { echo "setup: $*"; }

# --- system tools -------------------------------------------------------------------------------------
command -v "$PY" >/dev/null || die "$PY not found (Debian 12: apt-get install python3.11 python3.11-venv)"

if ! java -version 2>&1 | grep -q 'version "17'; then
  die "Java 17 is needed by pyspark and pyflink: apt-get install openjdk-17-jre-headless"
fi

if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    say "installing redis-server (tests run a real one)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
  else
    die "redis-server is missing (tests run a real one): sudo apt-get install redis-server"
  fi
fi

# --- virtualenvs --------------------------------------------------------------------------------------
stamp_hash() { cat "$@" pyproject.toml | sha256sum | cut -d' ' -f1; }

up_to_date() {  # venv hash
  [ -x "$1/bin/python" ] && [ "$(cat "$1/.setup-stamp" 2>/dev/null)" = "$2" ]
}

pip_in() {  # venv args...: quiet on success (build backends are chatty); the log's tail on failure
  local venv=$1 log=$1/setup-pip.log; shift
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "pip install $* failed in $venv (full log: $log)"
  fi
}

make_venv() {  # venv
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
  pip_in "$1" --upgrade pip
}

[ -f requirements/main.txt ] || die "requirements/main.txt is missing"
[ -f requirements/stream.txt ] || die "requirements/stream.txt is missing"

h=$(stamp_hash requirements/main.txt)
if up_to_date .venv "$h"; then
  say ".venv up to date"
else
  say "building .venv (main: spark, feast, airflow, torch, ...)"
  make_venv .venv
  # torch first and alone: the pin resolves to the local CPU wheel; letting the resolver pick torch
  # inside the big install can pull GBs of CUDA wheels.
  pip_in .venv torch==2.13.0
  pip_in .venv -r requirements/main.txt
  pip_in .venv -e . --no-deps
  echo "$h" > .venv/.setup-stamp
fi

h=$(stamp_hash requirements/stream.txt)
if up_to_date .venv-stream "$h"; then
  say ".venv-stream up to date"
else
  # A separate venv because apache-flink 2.3.0 caps numpy/pandas/pyarrow below what the main venv uses.
  say "building .venv-stream (Flink job runtime)"
  make_venv .venv-stream
  pip_in .venv-stream -r requirements/stream.txt
  pip_in .venv-stream -e . --no-deps
  echo "$h" > .venv-stream/.setup-stamp
fi
