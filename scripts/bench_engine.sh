#!/usr/bin/env bash
# Engine benchmark on the CPU backend: decode tokens/s at batch 1, 8 and 32 and prefill tokens/s,
# on the bundled model, on a ~100M-parameter random-weight Llama written on the fly (in
# .headroom/bench-model-100m, not committed) and on a ~0.5B random Qwen3-MoE of which a token
# reads ~0.1B (32 experts, top 4; .headroom/bench-model-moe; HEADROOM_BENCH_MOE=0 leaves it out). The batch-1 bandwidth fraction comes from five short
# batch-1 decode runs, with the streaming-read bandwidth sampled before, during and after each: the
# median of the five, with the lowest and highest. The last line of output is one JSON object.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom_engine_bench >/dev/null
bench=build-release/tests/headroom_engine_bench
big=$root/.headroom/bench-model-100m
if [ ! -f "$big/model.safetensors" ]; then
  $bench --make-random-model "$big" --tokenizer-from models/tiny-reverse
fi
tiny_json=$($bench --model models/tiny-reverse | tail -1)
big_json=$($bench --model "$big" | tail -1)
moe_json=null
if [ "${HEADROOM_BENCH_MOE:-1}" != 0 ]; then
  moe=$root/.headroom/bench-model-moe
  if [ ! -f "$moe/model.safetensors" ]; then
    $bench --make-random-model "$moe" --tokenizer-from models/tiny-reverse --experts on
  fi
  moe_json=$($bench --model "$moe" | tail -1)
fi
python3 - "$tiny_json" "$big_json" "$moe_json" <<'PY'
import json, sys
tiny, big, moe = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps({
    "batch32_over_batch1": big["batch32_over_batch1"],
    "batch1_bandwidth_fraction": big["batch1_bandwidth_fraction"],
    "batch1_bandwidth_fraction_range": [big["batch1_bandwidth_fraction_min"],
                                        big["batch1_bandwidth_fraction_max"]],
    "goals": {"batch32_over_batch1": ">= 6", "batch1_bandwidth_fraction": ">= 0.5"},
    "tiny": tiny, "model_100m": big, "model_moe": moe}))
PY
