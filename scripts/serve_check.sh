#!/usr/bin/env bash
# The product end to end on one device: starts private Postgres and Redis, migrates, runs
# `headroom serve --device DEVICE` with the bundled model on a free port, and checks over HTTP that
# a chat completion, a streamed one and a queued batch of 24 requests (polled to completion) all
# answer what the model answers (it reverses the text after "reverse: "), then stops everything.
#   scripts/serve_check.sh [DEVICE]          (cpu, cuda or cuda:N; default cuda)
# HEADROOM_CUDA_OPTIONS (serve's --cuda-options) passes CUDA backend settings through.
# HEADROOM_PORTABLE=FILE.tar.xz (scripts/pack_portable.sh) runs the packed headroom, Postgres and
# Redis: for a GPU machine without this project's packages. Otherwise it builds (Release) and uses
# the system's packages (scripts/setup.sh). Last line: one JSON object with the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
device=${1:-cuda}
work=$(mktemp -d /tmp/headroom-serve-check.XXXXXX)
chmod 755 "$work"

if [ -n "${HEADROOM_PORTABLE:-}" ]; then
  # shellcheck source=scripts/portable_lib.sh
  source scripts/portable_lib.sh
  portable_unpack "$HEADROOM_PORTABLE" "$work/portable"
  headroom=$portable_headroom
else
  scripts/setup.sh >/dev/null
  cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom
  headroom=$root/build-release/headroom
fi

pid=
cleanup() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  scripts/services.sh stop "$work/services" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/services"
chmod 755 "$work/services"
scripts/services.sh start "$work/services" >/dev/null
# shellcheck disable=SC1091
source "$work/services/env"
"$headroom" migrate >/dev/null

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export HEADROOM_API_KEY="hr_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
start=$(date +%s%N)
"$headroom" serve --model "$root/models/tiny-reverse" --device "$device" --port "$port" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -30 "$work/serve.log" >&2
    echo "serve_check: headroom serve exited" >&2
    exit 1
  fi
  sleep 0.2
done
ready_ms=$(( ($(date +%s%N) - start) / 1000000 ))

rc=0
SERVE_LOG=$work/serve.log python3 - "$port" "$HEADROOM_API_KEY" "$device" "$ready_ms" <<'PY' || rc=$?
import json, os, sys, time, urllib.request

port, key, device, ready_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
base = f"http://127.0.0.1:{port}"
model = "@hr/tiny-reverse"


def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def ask(word):
    return {"model": model, "messages": [{"role": "user", "content": f"reverse: {word}"}], "max_tokens": 40}


failures = []
t0 = time.time()
answer = json.loads(call("POST", "/v1/chat/completions", ask("hello world")))
got = answer["choices"][0]["message"]["content"]
if got != "dlrow olleh":
    failures.append(f"chat completion answered {got!r}")
sync_ms = (time.time() - t0) * 1000

streamed = ""
for line in call("POST", "/v1/chat/completions", dict(ask("stream"), stream=True)).splitlines():
    if line.startswith("data: ") and line != "data: [DONE]":
        for choice in json.loads(line[6:]).get("choices", []):
            streamed += choice.get("delta", {}).get("content") or ""
if streamed != "maerts":
    failures.append(f"stream answered {streamed!r}")

words = [f"batch{i:02d}x" for i in range(24)]
t0 = time.time()
queued = json.loads(call("POST", f"/ai/run/{model}?queueRequest=true",
                         {"requests": [{"messages": ask(w)["messages"]} for w in words]}))
request_id = queued["result"]["request_id"]
status, polled = None, {}
while time.time() - t0 < 180:
    polled = json.loads(call("GET", f"/v1/async/{request_id}"))["result"]
    status = polled.get("status")
    if status not in ("queued", "running"):
        break
    time.sleep(0.2)
batch_s = time.time() - t0
if status != "completed":
    failures.append(f"batch ended {status!r}: {json.dumps(polled)[:300]}")
else:
    answers = [(r.get("result") or {}).get("response") for r in polled.get("responses", [])]
    # Each equals the model's own answer to that prompt alone, and nearly all are right (the
    # model reverses about 99.6% of unseen prompts correctly).
    alone = [json.loads(call("POST", "/v1/chat/completions", ask(w)))["choices"][0]["message"]["content"]
             for w in words]
    if answers != alone:
        failures.append(f"batch answered {answers[:3]}..., alone {alone[:3]}...")
    right = sum(a == w[::-1] for a, w in zip(answers, words))
    if right < len(words) - 2:
        failures.append(f"only {right} of {len(words)} batch answers are the reversal")

# The settings asked for are the ones the backend logged (name=value; a bare name: its first value).
options = os.environ.get("HEADROOM_CUDA_OPTIONS", "")
if options:
    logged = ""
    with open(os.environ["SERVE_LOG"]) as f:
        for line in f:
            if "event=backend.cuda_settings" in line or '"backend.cuda_settings"' in line:
                logged = "," + line.split("settings=")[-1].strip().strip('"}') + ","
    bare = {"decode_attention": "tensor_core", "prefetch_weights": "8mb"}  # see cuda_settings()
    for item in options.split(","):
        name, _, value = item.partition("=")
        want = f",{name}={value or bare.get(name, 'on')},"
        if want not in logged:
            failures.append(f"the backend did not log {want.strip(',')} (logged: {logged.strip(',') or 'nothing'})")

for f in failures:
    print("serve_check:", f, file=sys.stderr)
print(json.dumps({"device": device, "cuda_options": os.environ.get("HEADROOM_CUDA_OPTIONS", ""),
                  "ok": not failures, "ready_ms": ready_ms, "sync_ms": round(sync_ms, 1),
                  "batch_requests": len(words), "batch_s": round(batch_s, 2)}))
# (batch_s: submit to completed, polled every 0.2 s)
sys.exit(1 if failures else 0)
PY
if [ "$rc" -ne 0 ]; then
  echo "serve_check: last lines of the server's log:" >&2
  tail -20 "$work/serve.log" >&2
fi
exit "$rc"
