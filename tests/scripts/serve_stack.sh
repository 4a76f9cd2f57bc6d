# shellcheck shell=bash
# Sourced by the test scripts that need a running product: `serve_stack BIN SRC KEY [ARGS...]`
# starts private Postgres and Redis in a temporary folder and `headroom serve` on the bundled
# model with HEADROOM_API_KEY=KEY (ARGS go to serve), waits until it is ready, and sets `svc` (the
# folder; its env is sourced, serve's log is $svc/serve.log), `u` (serve's base URL) and `pid`.
# Everything stops when the script exits.
serve_stack() {
  local bin=$1 src=$2 key=$3
  shift 3
  svc=$(mktemp -d /tmp/hr-serve-stack.XXXXXX)
  chmod 755 "$svc"
  pid=
  _serve_stack_src=$src
  trap _serve_stack_stop EXIT
  "$src/scripts/services.sh" start "$svc" >/dev/null
  # shellcheck disable=SC1091
  source "$svc/env"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  HEADROOM_API_KEY=$key "$bin" --log-level warn serve --model "$src/models/tiny-reverse" \
    --port "$port" "$@" >"$svc/serve.log" 2>&1 &
  pid=$!
  u=http://127.0.0.1:$port
  for _ in $(seq 1 100); do curl -sf "$u/readyz" >/dev/null && return 0; sleep 0.2; done
  echo "serve_stack: headroom serve did not become ready; its log:" >&2
  tail -20 "$svc/serve.log" >&2
  return 1
}

_serve_stack_stop() {
  if [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; fi
  "$_serve_stack_src/scripts/services.sh" stop "$svc" >/dev/null 2>&1 || true
  rm -rf "$svc"
}
