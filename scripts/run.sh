#!/usr/bin/env bash
# Runs the product on this machine: installs what is missing, builds (Release), starts Postgres and
# Redis under .headroom/ in the checkout, applies migrations and starts `headroom serve` with the
# bundled model. Ctrl-C stops everything it started; if `serve` itself stops, Postgres and Redis
# keep running (and keep the data) for the next start, and `scripts/services.sh stop .headroom`
# stops them. HEADROOM_PORT picks the HTTP port (8080); HEADROOM_API_KEY the default account's key,
# at least 16 characters (else one is made and kept in .headroom/api_key).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -n "${HEADROOM_API_KEY:-}" ] && [ "${#HEADROOM_API_KEY}" -lt 16 ]; then
  echo "run.sh: HEADROOM_API_KEY must be at least 16 characters (it has ${#HEADROOM_API_KEY}); unset it to have one made" >&2
  exit 2
fi

scripts/setup.sh
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom

scripts/services.sh start "$root/.headroom"
# shellcheck disable=SC1091
source "$root/.headroom/env"
# Postgres and Redis stop with run.sh when it is interrupted or fails before `serve` runs.
stop_all() { scripts/services.sh stop "$root/.headroom" >/dev/null 2>&1 || true; }
trap stop_all EXIT
trap 'exit 130' INT TERM

build-release/headroom migrate
port=${HEADROOM_PORT:-8080}
export HEADROOM_PORT=$port
if [ -z "${HEADROOM_API_KEY:-}" ]; then
  if [ ! -s "$root/.headroom/api_key" ]; then
    echo "hr_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$root/.headroom/api_key"
  fi
  HEADROOM_API_KEY=$(cat "$root/.headroom/api_key")
fi
export HEADROOM_API_KEY
cat <<EOF

Headroom is starting on http://127.0.0.1:$port (Ctrl-C stops it and its services).
API key: $HEADROOM_API_KEY

Submit a batch:
  curl -s -X POST "http://127.0.0.1:$port/ai/run/@hr/tiny-reverse?queueRequest=true" \\
    -H "Authorization: Bearer $HEADROOM_API_KEY" \\
    -d '{"requests": [{"messages": [{"role": "user", "content": "reverse: hello world"}]}]}'
Poll it (with the request_id from the answer):
  curl -s "http://127.0.0.1:$port/v1/async/REQUEST_ID" -H "Authorization: Bearer $HEADROOM_API_KEY"
Ask synchronously (OpenAI shape):
  curl -s http://127.0.0.1:$port/v1/chat/completions -H "Authorization: Bearer $HEADROOM_API_KEY" \\
    -d '{"model": "@hr/tiny-reverse", "messages": [{"role": "user", "content": "reverse: hello"}]}'
OpenAI's Batch API (the OpenAI SDKs work with baseURL http://127.0.0.1:$port/v1; docs/openai-batch.md):
  curl -s http://127.0.0.1:$port/v1/files -H "Authorization: Bearer $HEADROOM_API_KEY" \\
    -F purpose=batch -F file=@requests.jsonl

EOF
build-release/headroom serve --model "$root/models/tiny-reverse" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 130' INT TERM
rc=0
wait $pid || rc=$?
# `serve` stopped by itself (a crash, a bad flag): its services and their data stay up, so that
# running this script again picks up where it was.
trap - EXIT
echo "run.sh: headroom serve exited with status $rc; Postgres and Redis keep running under" \
  ".headroom/ (scripts/services.sh stop .headroom stops them)" >&2
exit "$rc"
