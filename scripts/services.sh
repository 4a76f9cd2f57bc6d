#!/usr/bin/env bash
# Private PostgreSQL 15 and Redis 7 for one checkout or one test run, without systemd.
#   scripts/services.sh start|stop|status|env [DIR]      (DIR defaults to .headroom/ in the checkout)
# Ports come from PG_PORT / REDIS_PORT, else from DIR/ports (kept across restarts), else free ones.
# Postgres keeps fsync on; Redis runs with appendonly yes, appendfsync everysec, noeviction.
# Postgres refuses to run as root: as root, it runs as the system user `headroom`.
# `start` prints the URLs and writes them to DIR/env (HEADROOM_DATABASE_URL, HEADROOM_REDIS_URL,
# HEADROOM_ADMIN_DATABASE_URL, and HEADROOM_SECRET_KEY_FILE: DIR/secret.key, the key that seals
# webhook secrets) for `source`. Postgres asks for a password (SCRAM-SHA-256, over TCP and its
# socket alike): a random one kept in DIR/pg_password and written into the URLs. Several DIRs can
# run side by side.
set -euo pipefail

cmd=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${2:-$root/.headroom}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac  # the servers' own paths must not depend on their cwd
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_USER=headroom

usage() { echo "usage: $0 start|stop|status|env [DIR]" >&2; exit 2; }
[ -n "$cmd" ] || usage

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

as_pg() {  # run a command as the Postgres owner
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$PG_USER" -- "$@"; else "$@"; fi
}

ensure_pg_user() {
  [ "$(id -u)" -eq 0 ] || return 0
  id "$PG_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER"
}

load_ports() {
  if [ -f "$dir/ports" ]; then
    # shellcheck disable=SC1091
    source "$dir/ports"
  fi
  # A port picked here (neither given nor saved) may be taken by another program before the
  # server binds it: such a port is picked again when the server cannot start on it.
  PG_PICKED=; REDIS_PICKED=
  [ -n "${PG_PORT:-${SAVED_PG_PORT:-}}" ] || PG_PICKED=1
  [ -n "${REDIS_PORT:-${SAVED_REDIS_PORT:-}}" ] || REDIS_PICKED=1
  PG_PORT=${PG_PORT:-${SAVED_PG_PORT:-$(free_port)}}
  REDIS_PORT=${REDIS_PORT:-${SAVED_REDIS_PORT:-$(free_port)}}
  save_ports
}

save_ports() {
  printf 'SAVED_PG_PORT=%s\nSAVED_REDIS_PORT=%s\n' "$PG_PORT" "$REDIS_PORT" >"$dir/ports"
}

# Where the Postgres data lives: DIR/pg, unless the Postgres owner cannot reach DIR (e.g. a
# checkout under /root), in which case a folder under /var/lib/headroom linked from DIR/pg.
pg_home() {
  if [ -L "$dir/pg" ] || [ -d "$dir/pg" ]; then echo "$dir/pg"; return; fi
  if [ "$(id -u)" -eq 0 ] && ! runuser -u "$PG_USER" -- test -x "$dir"; then
    local alt
    alt=/var/lib/headroom/pg-$(echo -n "$dir" | sha1sum | cut -c1-12)
    mkdir -p "$alt"
    ln -s "$alt" "$dir/pg"
  else
    mkdir -p "$dir/pg"
  fi
  echo "$dir/pg"
}

# A secret file of 64 random hex digits, made once and readable by its owner only.
ensure_secret() {
  [ -s "$1" ] && return 0
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1")
}

write_env() {
  cat >"$dir/env" <<ENV
export HEADROOM_DATABASE_URL=postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/headroom
export HEADROOM_ADMIN_DATABASE_URL=postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/postgres
export HEADROOM_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export HEADROOM_SECRET_KEY_FILE=$dir/secret.key
ENV
  chmod 600 "$dir/env"
}

start_pg() {
  local home
  home=$(pg_home)
  if [ "$(id -u)" -eq 0 ]; then chown -R "$PG_USER" "$(readlink -f "$home")"; fi
  local set_password=
  if [ ! -f "$home/data/PG_VERSION" ]; then
    local pwfile
    pwfile=$(as_pg mktemp)
    as_pg sh -c "cat >'$pwfile'" <<<"$PG_PASSWORD"
    as_pg "$PG_BIN/initdb" -D "$home/data" -U "$PG_USER" --auth=scram-sha-256 --pwfile="$pwfile" \
      -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 || { rm -f "$pwfile"; cat "$dir/initdb.log" >&2; exit 1; }
    rm -f "$pwfile"
  elif ! grep -q '^host.*scram-sha-256' "$home/data/pg_hba.conf"; then
    set_password=1  # made before passwords: set ours, then require it (below)
  fi
  cat >"$home/data/postgresql.auto.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$(readlink -f "$home")'
fsync = on
synchronous_commit = on
max_connections = 300
shared_buffers = 256MB
log_min_messages = warning
CONF
  if as_pg "$PG_BIN/pg_ctl" -D "$home/data" status >/dev/null 2>&1; then return 0; fi
  if ! as_pg "$PG_BIN/pg_ctl" -D "$home/data" -l "$(readlink -f "$home")/postgres.log" -w -t 60 start >/dev/null; then
    if [ -n "$PG_PICKED" ] && [ "${pg_tries:-0}" -lt 3 ] && grep -q 'could not bind\|could not create any TCP' "$home/postgres.log"; then
      pg_tries=$((${pg_tries:-0} + 1))
      PG_PORT=$(free_port)
      save_ports
      start_pg
      return
    fi
    tail -20 "$home/postgres.log" >&2
    exit 1
  fi
  if [ -n "$set_password" ]; then
    as_pg psql -q -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres \
      -c "ALTER ROLE $PG_USER PASSWORD '$PG_PASSWORD'" >/dev/null
    printf 'local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n' \
      | as_pg sh -c "cat >'$home/data/pg_hba.conf'"
    as_pg "$PG_BIN/pg_ctl" -D "$home/data" reload >/dev/null
  fi
  if [ "$(as_pg env PGPASSWORD="$PG_PASSWORD" psql -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'headroom'")" != "1" ]; then
    as_pg env PGPASSWORD="$PG_PASSWORD" psql -q -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres \
      -c "CREATE DATABASE headroom" >/dev/null
  fi
}

start_redis() {
  mkdir -p "$dir/redis"
  if timeout 2 redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then return 0; fi
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$dir/redis" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction --save "" \
    --pidfile "$dir/redis/redis.pid" --logfile "$dir/redis/redis.log" >/dev/null
  for _ in $(seq 1 100); do
    timeout 2 redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
    # A server that could not bind its port has exited: no need to wait it out.
    if grep -q 'Could not create server TCP\|Address already in use' "$dir/redis/redis.log" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [ -n "$REDIS_PICKED" ] && [ "${redis_tries:-0}" -lt 3 ] \
    && grep -q 'Could not create server TCP\|Address already in use' "$dir/redis/redis.log" 2>/dev/null; then
    redis_tries=$((${redis_tries:-0} + 1))
    mv "$dir/redis/redis.log" "$dir/redis/redis.log.port-$REDIS_PORT"
    REDIS_PORT=$(free_port)
    save_ports
    start_redis
    return
  fi
  echo "redis did not start; see $dir/redis/redis.log" >&2
  exit 1
}

case "$cmd" in
  start)
    mkdir -p "$dir"
    ensure_secret "$dir/pg_password"
    ensure_secret "$dir/secret.key"
    PG_PASSWORD=$(cat "$dir/pg_password")
    ensure_pg_user
    load_ports
    start_pg
    start_redis
    write_env
    echo "postgres: postgresql://$PG_USER@127.0.0.1:$PG_PORT/headroom"
    echo "redis:    redis://127.0.0.1:$REDIS_PORT/0"
    echo "env:      source $dir/env"
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    load_ports
    if [ -f "$dir/pg/data/PG_VERSION" ]; then
      as_pg "$PG_BIN/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    redis-cli -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true
    echo "stopped services in $dir"
    ;;
  status)
    [ -d "$dir" ] || { echo "no services in $dir"; exit 3; }
    load_ports
    rc=0
    if [ -f "$dir/pg/data/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" -D "$dir/pg/data" status >/dev/null 2>&1; then
      echo "postgres: running on 127.0.0.1:$PG_PORT"
    else
      echo "postgres: stopped"; rc=3
    fi
    if timeout 2 redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
      echo "redis:    running on 127.0.0.1:$REDIS_PORT"
    else
      echo "redis:    stopped"; rc=3
    fi
    exit $rc
    ;;
  env)
    cat "$dir/env"
    ;;
  *) usage ;;
esac
