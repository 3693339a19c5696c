#!/usr/bin/env bash
# Fetch and build the JVM jars Quiver runs with, from Maven Central, into build/jars/<name>/ (never committed).
#
# Each folder of infra/jvm/ with a pom.xml is one bundle:
#   * packaging "pom": its runtime dependencies are copied (the Kafka broker, Flink's Kafka connector, s3a);
#   * packaging "jar": our own Java code, built (tests skipped here; `make test` runs them) and copied.
# A bundle is redone only when its pom or sources change (a stamp of their hash); Maven's own cache
# (~/.m2) keeps the downloads, so a `make clean` costs a copy, not a download. Usage: jars.sh [name...]
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "jars: ERROR: $*" >&2; exit 1; }
say() { echo "jars: $*"; }

command -v mvn >/dev/null || die "Maven is missing (it fetches the Kafka and Flink jars): sudo apt-get install maven"

bundle_hash() {  # dir: hash of the pom and every source file under it, and under the paths its hash-inputs lists
  local extra=()  # files from elsewhere in the checkout that go into the jar (the redis sink's Lua scripts)
  [ -f "$1/hash-inputs" ] && mapfile -t extra < <(grep -v -e '^#' -e '^$' "$1/hash-inputs")
  find "$1" "${extra[@]}" -path "$1/target" -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
}

mvn_quiet() {  # log args...: quiet on success; the log's tail on failure
  local log=$1; shift
  if ! mvn -B -q "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "mvn $* failed (full log: $log)"
  fi
}

names=("$@")
[ ${#names[@]} -gt 0 ] || for pom in infra/jvm/*/pom.xml; do names+=("$(basename "$(dirname "$pom")")"); done

for name in "${names[@]}"; do
  src=infra/jvm/$name out=build/jars/$name
  [ -f "$src/pom.xml" ] || die "no bundle $name (infra/jvm/$name/pom.xml)"
  h=$(bundle_hash "$src")
  if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$h" ]; then
    say "$name up to date"
    continue
  fi
  say "fetching $name"
  rm -rf "$out" && mkdir -p "$out"
  log=$PWD/$out.log
  if grep -q '<packaging>pom</packaging>' "$src/pom.xml"; then
    mvn_quiet "$log" -f "$src/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$PWD/$out"
  else
    mvn_quiet "$log" -f "$src/pom.xml" package -DskipTests
    cp "$src"/target/"$name"-*.jar "$out"/
    rm -rf "$src/target"
  fi
  echo "$h" > "$out/.stamp"
done
