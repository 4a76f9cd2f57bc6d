#!/usr/bin/env bash
# Rank-slice benchmark (GPU; docs/parallel-engine.md): one rank's shard of a Llama-3.3-70B
# deployment at TP4 and TP8 (80 layers of 8192; 64/tp query heads, 8/tp KV heads, one replicated
# at TP8 since 8/8 = 1; 28672/tp MLP rows; the LM head's 128256/tp vocabulary rows), random bf16
# weights made on the GPU, through our engine: decode tokens/s and step time at batch 1, 64 and
# 256 (headroom_gpu_bench with the slice's shape). Then the all-reduce microbenchmark
# (headroom_allreduce_bench: our one-shot kernel over 2, 4 and 8 virtual ranks on this GPU, our
# peer kernels at 2, 4 and 8 ranks with their flag barriers (a GPU a rank where there are enough,
# else sharing this one), NCCL over the visible GPUs), and the projected full-deployment step:
#   step = slice step + 2 x 80 all-reduces of the residual rows (batch x 8192 fp32) + the logits'
#          all-gather (batch x 128256 fp32, counted as one all-reduce of that size)
# with each all-reduce's latency taken two ways: our kernel's at that size and rank count on one
# GPU (the peers' reads at local memory speed: a lower bound), and SGLang's custom all-reduce on
# 8 H100s (PR #2904: 3.7-5.9 us for 512 B-32 KB; larger messages at 5.9 us plus the bytes over
# 450 GB/s of NVLink, a rough stand-in). The anchor: TensorRT-LLM's Llama-3.3-70B FP8 on 2 H100s,
# 4,205 tok/s at 1000/1000.
# The last line is one JSON object. HEADROOM_PREBUILT=DIR uses binaries already built in DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -n "${HEADROOM_PREBUILT:-}" ]; then
  bin=$HEADROOM_PREBUILT
else
  scripts/setup.sh >/dev/null
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEADROOM_CUDA=ON >/dev/null
  cmake --build build-gpu -j "${HEADROOM_JOBS:-$(nproc)}" \
    --target headroom_gpu_bench headroom_allreduce_bench >/dev/null
  bin=build-gpu/tests
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin/headroom_allreduce_bench" | tee "$work/allreduce.log"
for tp in 4 8; do
  kv=$((8 / tp))
  echo "rank slice: Llama-3.3-70B at TP$tp" >&2
  # A short prompt and few steps: the decode step's time is what is measured; 2 prefills.
  "$bin/headroom_gpu_bench" --layers 80 --hidden 8192 --intermediate $((28672 / tp)) \
    --heads $((64 / tp)) --kv-heads "$kv" --head-dim 128 --vocab $(((128256 + tp - 1) / tp)) \
    --batches 1,64,256 --prompt 256 --steps 16 --prefill-prompt 2048 --prefill-count 2 \
    --copy-mb 1024 --rotate-mb 400 | tee "$work/tp$tp.log" || true
done

python3 - "$work" <<'EOF'
import json, math, sys, os
work = sys.argv[1]
def last_json(path):
    line = None
    for l in open(path):
        if l.startswith("{"):
            line = l
    return json.loads(line) if line else None
ar = last_json(os.path.join(work, "allreduce.log")) or {}
D, V, L = 8192, 128256, 80

def own_latency(ranks, nbytes):
    """Our kernel's measured latency at this rank count, interpolated in log-log by size."""
    table = (ar.get("own_one_shot") or {}).get("%d_virtual_ranks" % ranks) or []
    pts = [(r["bytes"], r["us"]) for r in table if r.get("us", -1) > 0]
    if not pts:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (b0, u0), (b1, u1) in zip(pts, pts[1:]):
        if nbytes <= b1:
            f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(u0) + f * (math.log(u1) - math.log(u0)))
    (b0, u0), (b1, u1) = pts[-2], pts[-1]
    return u1 * nbytes / b1  # past the table: by bandwidth

def anchor_latency(nbytes):
    """SGLang's custom all-reduce on 8 H100s: 3.7-5.9 us for 512 B-32 KB; beyond, NVLink's 450 GB/s."""
    if nbytes <= 512:
        return 3.7
    if nbytes <= 32768:
        return 3.7 + (5.9 - 3.7) * math.log(nbytes / 512) / math.log(64)
    return 5.9 + (nbytes - 32768) / 450e9 * 1e6

out = {"allreduce": ar, "slices": {}, "anchor_trtllm_llama70b_fp8_tp2_tok_s": 4205}
for tp in (4, 8):
    b = last_json(os.path.join(work, "tp%d.log" % tp))
    if not b:
        out["slices"]["tp%d" % tp] = None
        continue
    step_ms = b.get("decode_step_ms") or {}
    rows = {}
    for batch in (1, 64, 256):
        ms = step_ms.get(str(batch))
        if ms is None:
            continue
        resid, logits = batch * D * 4, batch * V * 4
        proj = {}
        for name, lat in (("own_kernel_one_gpu", lambda n: own_latency(tp, n)), ("sglang_anchor", anchor_latency)):
            a, g = lat(resid), lat(logits)
            if a is None or g is None:
                continue
            comm_ms = (2 * L * a + g) / 1e3
            proj[name] = {"allreduce_us": round(a, 2), "comm_ms": round(comm_ms, 3),
                          "step_ms": round(ms + comm_ms, 3),
                          "tok_s": round(batch / ((ms + comm_ms) / 1e3), 1)}
        rows[str(batch)] = {"slice_step_ms": ms, "slice_tok_s": (b.get("decode_tok_s") or {}).get(str(batch)),
                            "projected": proj}
    out["slices"]["tp%d" % tp] = {"weight_bytes": b.get("weight_bytes"), "kv_cache_bytes": b.get("kv_cache_bytes"),
                                  "batch1_mbu": b.get("batch1_mbu"), "decode": rows,
                                  "complete": b.get("complete"), "errors": b.get("errors")}
print(json.dumps(out))
EOF
