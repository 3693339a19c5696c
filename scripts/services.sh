#!/usr/bin/env bash
# Throwaway local services for demos and manual testing (the pytest fixtures start their own).
#   scripts/services.sh start-redis PORT DIR      | stop-redis DIR
#   scripts/services.sh start-postgres PORT DIR   | stop-postgres DIR
# Everything lives in DIR (its parents must be traversable by the cluster owner) and listens on 127.0.0.1.
set -euo pipefail

PG_USER=${PG_USER:-postgres}   # PostgreSQL refuses to run as root: as root the cluster runs as this user
PG_SUPERUSER=quiver

start-redis() {
  local port=$1 dir; mkdir -p "$2"; dir=$(cd "$2" && pwd)
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 100); do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && { echo "redis://127.0.0.1:$port/0"; return; }
    sleep 0.1
  done
  echo "redis did not start; see $dir/redis.log" >&2; return 1
}

stop-redis() {
  local pidfile=$1/redis.pid pid
  [ -f "$pidfile" ] || { echo "no redis pidfile in $1" >&2; return 0; }
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$pidfile"
}

pg_bin() {
  local d; d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$d" ] || { echo "PostgreSQL binaries not found: apt-get install postgresql" >&2; return 1; }
  echo "$d"
}

as_pg() {  # run a command as the unprivileged cluster owner when we are root
  if [ "$(id -u)" -eq 0 ]; then
    id "$PG_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER"
    (cd / && runuser -u "$PG_USER" -- "$@")
  else
    "$@"
  fi
}

start-postgres() {
  local port=$1 dir bin; mkdir -p "$2/sock"; dir=$(cd "$2" && pwd); bin=$(pg_bin)
  if [ "$(id -u)" -eq 0 ]; then as_pg true; chown -R "$PG_USER" "$dir"; fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$bin/initdb" -D "$dir/data" -U "$PG_SUPERUSER" --auth=trust -E UTF8 --locale=C --no-sync >/dev/null
  fi
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w \
    -o "-p $port -k $dir/sock -c listen_addresses=127.0.0.1" start >/dev/null
  echo "postgresql+psycopg://$PG_SUPERUSER@127.0.0.1:$port/postgres"
}

stop-postgres() {
  local dir; dir=$(cd "$1" && pwd)
  [ -f "$dir/data/postmaster.pid" ] || { echo "no running cluster in $dir" >&2; return 0; }
  as_pg "$(pg_bin)/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
}

case "${1:-}" in
  start-redis|start-postgres) [ $# -eq 3 ] || { echo "usage: $0 $1 PORT DIR" >&2; exit 2; }; "$@" ;;
  stop-redis|stop-postgres) [ $# -eq 2 ] || { echo "usage: $0 $1 DIR" >&2; exit 2; }; "$@" ;;
  *) sed -n '2,5p' "$0" >&2; exit 2 ;;
esac
