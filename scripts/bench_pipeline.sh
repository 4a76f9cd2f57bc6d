#!/usr/bin/env bash
# Pipeline stages on the CPU backend (docs/parallel-engine.md "Balancing the stages"): decode and
# prefill step times of two stages split evenly or balanced by measured stage time, with steps
# cut into a micro-batch per stage or never, and whole answers through the engine with a step of
# other sequences for each stage in flight against one group of cut steps (long prompts arriving
# among answers too), on the
# ~100M-parameter random Llama (.headroom/bench-model-100m) and on a ~110M one whose LM head costs
# ~10 layers, as Qwen3-0.6B's does (.headroom/bench-model-wide-vocab; both written on the fly, not
# committed); then the load's rate against the disk's cold read rate. HEADROOM_BENCH_BUILD=DIR
# uses an existing build folder; HEADROOM_PIPELINE_ROUNDS steps per figure (20). The last line of
# output is one JSON object.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
build=${HEADROOM_BENCH_BUILD:-build-release}
if [ -z "${HEADROOM_BENCH_BUILD:-}" ]; then
  cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j "${HEADROOM_JOBS:-2}" \
  --target headroom_pipeline_bench headroom_engine_bench >/dev/null
big=$root/.headroom/bench-model-100m
if [ ! -f "$big/model.safetensors" ]; then
  "$build/tests/headroom_engine_bench" --make-random-model "$big" --tokenizer-from models/tiny-reverse
fi
wide=$root/.headroom/bench-model-wide-vocab
if [ ! -f "$wide/model.safetensors" ]; then
  "$build/tests/headroom_engine_bench" --make-random-model "$wide" --tokenizer-from models/tiny-reverse \
    --shape wide-vocab
fi
rounds=${HEADROOM_PIPELINE_ROUNDS:-20}
stages_json=$("$build/tests/headroom_pipeline_bench" --model "$big" --pp 2 --rounds "$rounds" |
  tee >(cat >&2) | tail -1)
wide_json=$("$build/tests/headroom_pipeline_bench" --model "$wide" --pp 2 --rounds "$rounds" |
  tee >(cat >&2) | tail -1)
load_json=$("$build/tests/headroom_pipeline_bench" --load "$big" --pp 2 --rounds 3 | tail -1)
python3 - "$stages_json" "$wide_json" "$load_json" <<'PY'
import json, sys
stages, wide, load = (json.loads(a) for a in sys.argv[1:4])
print(json.dumps({
    "speedup_over_even": stages["speedup_over_even"],
    "wide_vocab_speedup_over_even": wide["speedup_over_even"],
    "groups_over_one_group": stages["groups_over_one_group"],
    "stage_layers": stages["stage_layers"],
    "wide_vocab_stage_layers": wide["stage_layers"],
    "disk_cold_read_gbs": load["disk_cold_read_gbs"],
    "load_over_disk": load["over_disk"],
    "stages": stages, "wide_vocab": wide, "load": load}))
PY
