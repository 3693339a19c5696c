#!/usr/bin/env bash
# Build both virtualenvs and check system tools. Idempotent: a venv is only (re)installed when the hash
# of its requirements (+ pyproject.toml) differs from the stamp stored inside it.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
TORCH_VERSION=2.13.0

die() { echo "setup: ERROR: $*" >&2; exit 1; }
say() { echo "setup: $*"; }

# Java: pyspark 4 and pyflink 2.3 run on Java 17 and newer (their documented floors); 17 is what CI runs.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\).*/\1/p' | head -n 1; }

# torch, chosen explicitly (QUIVER_TORCH=cpu|cuda overrides the guess):
#   cpu  — machines without an NVIDIA GPU (laptops, CI, the feature/prediction servers): the CPU build
#          torch==X+cpu from PyTorch's CPU wheel index (QUIVER_TORCH_INDEX, default
#          https://download.pytorch.org/whl/cpu), or from a local wheel folder pip already uses (find-links).
#          No CUDA libraries: about 2 GB less than the default wheel. Where neither can be had (the index
#          unreachable), PyPI's torch==X, which runs on CPU as well.
#   cuda — GPU training workers (guessed when `nvidia-smi -L` lists a GPU): PyPI's torch==X, which on Linux
#          is the CUDA build and bundles its CUDA runtime (the driver must be installed on the host).
torch_variant() {
  if [ -n "${QUIVER_TORCH:-}" ]; then echo "$QUIVER_TORCH"
  elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then echo cuda
  else echo cpu; fi
}

index_reachable() {  # url: answers within a few seconds (a closed network fails at once or times out)
  "$PY" - "$1" <<'PYCODE' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=8).close()
PYCODE
}

torch_pip_args() {  # the arguments of the pip install that puts torch in .venv
  case "$(torch_variant)" in
    cuda) echo "torch==$TORCH_VERSION" ;;
    cpu)
      local links dir
      links="${PIP_FIND_LINKS:-} $("${PIP_FOR_CONFIG:-pip3}" config get global.find-links 2>/dev/null || true)"
      for dir in $links; do
        if compgen -G "${dir#file://}/torch-$TORCH_VERSION+cpu-*.whl" >/dev/null; then
          echo "torch==$TORCH_VERSION+cpu"; return
        fi
      done
      local index=${QUIVER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
      if index_reachable "$index"; then
        echo "torch==$TORCH_VERSION+cpu --extra-index-url $index"
      else
        # No CPU build to be had (no local wheel, index unreachable): PyPI's build runs on CPU too, only
        # larger (it carries CUDA libraries it will not load here).
        echo "torch==$TORCH_VERSION"
      fi ;;
    *) die "QUIVER_TORCH must be cpu or cuda, got '$QUIVER_TORCH'" ;;
  esac
}

if [ "${1:-}" = "--plan" ]; then  # say what setup would choose, change nothing (tests and docs use this)
  major=$(java_major)
  if [ -n "$major" ] && [ "$major" -ge 17 ]; then echo "java: $major ok (17 or newer)"
  else echo "java: ${major:-none} too old (needs 17 or newer)"; fi
  echo "torch: $(torch_variant): pip install $(torch_pip_args)"
  exit 0
fi

# --- system tools -------------------------------------------------------------------------------------
command -v "$PY" >/dev/null || die "$PY not found (Debian 12: apt-get install python3.11 python3.11-venv)"

major=$(java_major)
if [ -z "$major" ] || [ "$major" -lt 17 ]; then
  die "Java 17 or newer is needed by pyspark and pyflink (found: ${major:-none}): apt-get install openjdk-17-jre-headless"
fi

apt_need() {  # package why: install a Debian package as root, or say how to; missing parts fail tests, never skip
  if [ "$(id -u)" -eq 0 ]; then
    say "installing $1 ($2)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null; }
  else
    die "$1 is missing ($2): sudo apt-get install $1"
  fi
}

command -v redis-server >/dev/null || apt_need redis-server "tests run a real one"
command -v redis-cli >/dev/null || apt_need redis-tools "the Redis Cluster tests make a cluster with redis-cli"
# Tests start a private PostgreSQL cluster (registry on Postgres).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null \
  || apt_need postgresql "tests run a private cluster"
# Tests drive a real Chromium, offline: the servers' /docs and the web console (Playwright with Debian's
# Chromium, no browser download).
command -v chromium >/dev/null || apt_need chromium "tests render /docs and the web console in a real browser"
# Maven fetches the JVM jars (Kafka broker, Flink's Kafka connector, s3a) and builds our Redis sink.
command -v mvn >/dev/null || apt_need maven "it fetches the Kafka, Flink and Hadoop jars from Maven Central"
# javac builds our jar (infra/jvm/redis-sink: the Flink Redis sink and the Kafka record parser); a JRE alone cannot.
command -v javac >/dev/null || apt_need openjdk-17-jdk-headless "javac builds our Flink jar (the Redis sink, the Kafka parser)"

# --- virtualenvs --------------------------------------------------------------------------------------
stamp_hash() { cat "$@" pyproject.toml | sha256sum | cut -d' ' -f1; }

up_to_date() {  # venv hash
  [ -x "$1/bin/python" ] && [ "$(cat "$1/.setup-stamp" 2>/dev/null)" = "$2" ]
}

# uv installs the pinned requirements with parallel downloads and no bytecode compile pass: most of a fresh
# setup's time. Where uv cannot be had or fails, pip does the same install (QUIVER_INSTALLER=pip forces it).
UV_VERSION=0.13.10

pip_in() {  # venv args...: quiet on success (build backends are chatty); the log's tail on failure
  local venv=$1 log=$1/setup-pip.log; shift
  if [ "${QUIVER_INSTALLER:-uv}" = uv ] && [ -x "$venv/bin/uv" ]; then
    # unsafe-best-match: pip's rule across indexes (the CPU torch index beside PyPI), not uv's first-index rule
    if UV_INDEX_STRATEGY=unsafe-best-match "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" "$@" \
        >"$log" 2>&1; then
      return 0
    fi
    say "uv could not install $* in $venv (log: $log); pip tries"
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "pip install $* failed in $venv (full log: $log)"
  fi
}

make_venv() {  # venv
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
  QUIVER_INSTALLER=pip pip_in "$1" --upgrade pip
  if [ "${QUIVER_INSTALLER:-uv}" = uv ] && ! "$1/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION" \
      >"$1/setup-uv.log" 2>&1; then
    say "uv $UV_VERSION could not be installed in $1 (log: $1/setup-uv.log): pip installs"
  fi
}

[ -f requirements/main.txt ] || die "requirements/main.txt is missing"
[ -f requirements/stream.txt ] || die "requirements/stream.txt is missing"

h=$(stamp_hash requirements/main.txt)
if up_to_date .venv "$h"; then
  say ".venv up to date"
else
  say "building .venv (main: spark, feast, airflow, torch, ...)"
  make_venv .venv
  # torch first and alone, as chosen above (torch_variant); the big install below then keeps it.
  say "torch: $(torch_variant) build"
  # shellcheck disable=SC2046  # the arguments are words on purpose
  pip_in .venv $(torch_pip_args)
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

# --- JVM jars (Maven Central, cached in ~/.m2; build/jars/) ---------------------------------------
bash scripts/jars.sh
