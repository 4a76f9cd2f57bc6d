#!/usr/bin/env bash
# Real answers against the published contract: starts private Postgres and Redis and
# `headroom serve` on the bundled model, calls one route of each kind (submit, poll with results,
# list, sync run, chat completion, models, file upload and list, OpenAI batch and list, webhook
# endpoint, signing secret, deliveries, both error shapes, a probe, the operator's view) and
# validates every answer with ajv against api/openapi.json's schemas
# (tests/node/openapi_answers.cjs).
# Usage: openapi_answers_test.sh HEADROOM_BINARY SOURCE_DIR NPM_PREFIX
set -euo pipefail
bin=$1
src=$2
prefix=$3
key=openapi-check-key-0123456789
# shellcheck source=tests/scripts/serve_stack.sh
source "$src/tests/scripts/serve_stack.sh"
serve_stack "$bin" "$src" "$key"
out="$svc/answers"
mkdir -p "$out"
auth="Authorization: Bearer $key"
m=$(curl -sf "$u/v1/models" -H "$auth" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
c() { curl -s "$@"; }
c -X POST "$u/ai/run/$m?queueRequest=true" -H "$auth" \
  -d '{"requests":[{"messages":[{"role":"user","content":"reverse: abc"}],"max_tokens":8},{"prompt":"reverse: q","max_tokens":4}],"completion_window":"1h","metadata":{"a":1}}' \
  >"$out/submit.json"
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["result"]["request_id"])' "$out/submit.json")
for _ in $(seq 1 50); do
  c "$u/v1/async/$id" -H "$auth" | grep -q '"finished_at"' && break
  sleep 0.1
done
c "$u/v1/async/$id?include=partial" -H "$auth" >"$out/poll.json"
c "$u/v1/async?limit=2" -H "$auth" >"$out/list.json"
c -X POST "$u/ai/run/$m" -H "$auth" -d '{"messages":[{"role":"user","content":"reverse: hi"}],"max_tokens":8}' >"$out/run.json"
c -X POST "$u/v1/chat/completions" -H "$auth" \
  -d "{\"model\":\"$m\",\"messages\":[{\"role\":\"user\",\"content\":\"reverse: hi\"}],\"max_tokens\":8}" >"$out/chat.json"
c "$u/v1/models" -H "$auth" >"$out/models.json"
printf '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"%s","messages":[{"role":"user","content":"reverse: x"}],"max_tokens":8}}\n' "$m" >"$svc/in.jsonl"
c -X POST "$u/v1/files" -H "$auth" -F purpose=batch -F "file=@$svc/in.jsonl" >"$out/file.json"
fid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$out/file.json")
c "$u/v1/files" -H "$auth" >"$out/files.json"
c -X POST "$u/v1/batches" -H "$auth" \
  -d "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" >"$out/batch.json"
c "$u/v1/batches" -H "$auth" >"$out/batches.json"
c -X POST "$u/v1/webhooks" -H "$auth" -d '{"url":"http://127.0.0.1:9/hook","description":"d"}' >"$out/endpoint.json"
c "$u/v1/webhooks" -H "$auth" >"$out/endpoints.json"
c "$u/v1/webhooks/signing-secret" -H "$auth" >"$out/secret.json"
c "$u/v1/webhooks/deliveries" -H "$auth" >"$out/deliveries.json"
c "$u/v1/async/00000000-0000-7000-8000-000000000000" -H "$auth" >"$out/err_wa.json"
c "$u/v1/batches/nope" -H "$auth" >"$out/err_oa.json"
c "$u/healthz" >"$out/health.json"
c "$u/v1/operator/stats" -H "$auth" >"$out/operator.json"  # serve's own key: an operator's
c "$u/v1/async/$id?include=partial&status=failed,completed" -H "$auth" >"$out/poll_filtered.json"
"$src/tests/scripts/npm_prefix.sh" "$prefix" ajv@8.17.1
node "$src/tests/node/openapi_answers.cjs" "$prefix/node_modules" "$src/api/openapi.json" "$out"
