#!/usr/bin/env bash
# scripts/services.sh runs two independent stacks side by side: separate ports and data; writing
# to one is invisible in the other; stopping one leaves the other running; a relative DIR works;
# Postgres wants the stack's password (SCRAM), and the secret files are the owner's alone.
set -euo pipefail
services=$1
a=$(mktemp -d /tmp/hr-stack-a.XXXXXX); b=$(mktemp -d /tmp/hr-stack-b.XXXXXX)
chmod 755 "$a" "$b"
cleanup() { "$services" stop "$a" >/dev/null 2>&1 || true; "$services" stop "$b" >/dev/null 2>&1 || true; rm -rf "$a" "$b"; }
trap cleanup EXIT
PG_PORT= REDIS_PORT= "$services" start "$a"
# (b by a relative path: the servers must not depend on the directory they were started from.)
(cd "$(dirname "$b")" && PG_PORT= REDIS_PORT= "$services" start "$(basename "$b")")
url() { (source "$1/env"; eval echo "\$$2"); }
pa=$(url "$a" HEADROOM_DATABASE_URL); pb=$(url "$b" HEADROOM_DATABASE_URL)
ra=$(url "$a" HEADROOM_REDIS_URL); rb=$(url "$b" HEADROOM_REDIS_URL)
[ "$pa" != "$pb" ] || { echo "FAIL: same Postgres URL $pa"; exit 1; }
[ "$ra" != "$rb" ] || { echo "FAIL: same Redis URL $ra"; exit 1; }
psql -q "$pa" -c "CREATE TABLE only_in_a (x int)"
redis-cli -u "$ra" set only_in_a 1 >/dev/null
[ "$(psql -tA "$pb" -c "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'")" = "0" ] \
  || { echo "FAIL: table leaked into stack b"; exit 1; }
[ "$(redis-cli -u "$rb" exists only_in_a)" = "0" ] || { echo "FAIL: key leaked into stack b"; exit 1; }
[ "$(redis-cli -u "$ra" config get appendonly | tail -1)" = "yes" ] || { echo "FAIL: appendonly"; exit 1; }
[ "$(redis-cli -u "$ra" config get maxmemory-policy | tail -1)" = "noeviction" ] || { echo "FAIL: policy"; exit 1; }
[ "$(psql -tA "$pa" -c "SHOW fsync")" = "on" ] || { echo "FAIL: fsync off"; exit 1; }
# The password is required: the URL without it, and with stack b's, are refused.
nopass=$(echo "$pa" | sed -E 's#//([^:@]+):[^@]*@#//\1@#')
[ "$nopass" != "$pa" ] || { echo "FAIL: no password in $pa"; exit 1; }
if PGPASSWORD= psql -w -tA "$nopass" -c "SELECT 1" >/dev/null 2>&1; then
  echo "FAIL: Postgres answered without a password"; exit 1
fi
wrong=$(echo "$pa" | sed -E "s#//([^:@]+):[^@]*@#//\1:$(cat "$b/pg_password")@#")
if psql -w -tA "$wrong" -c "SELECT 1" >/dev/null 2>&1; then
  echo "FAIL: Postgres answered to another stack's password"; exit 1
fi
[ "$(psql -tA "$pa" -c "SHOW password_encryption")" = "scram-sha-256" ] || { echo "FAIL: not SCRAM"; exit 1; }
for f in pg_password secret.key env; do
  [ "$(stat -c %a "$a/$f")" = "600" ] || { echo "FAIL: $f is $(stat -c %a "$a/$f")"; exit 1; }
done
[ "$(wc -c <"$a/secret.key")" = "64" ] || { echo "FAIL: secret.key is not 64 hex digits"; exit 1; }
"$services" stop "$a" >/dev/null
if "$services" status "$a" >/dev/null; then echo "FAIL: stack a still running"; exit 1; fi
"$services" status "$b" >/dev/null || { echo "FAIL: stopping a stopped b"; exit 1; }
# A restart keeps the same ports and data.
"$services" start "$a" >/dev/null
[ "$(url "$a" HEADROOM_DATABASE_URL)" = "$pa" ] || { echo "FAIL: port changed on restart"; exit 1; }
[ "$(psql -tA "$pa" -c "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'")" = "1" ] \
  || { echo "FAIL: data lost on restart"; exit 1; }
echo "services_two_stacks: ok"
