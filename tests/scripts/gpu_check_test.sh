#!/usr/bin/env bash
# scripts/gpu_check.sh's own bookkeeping, on a machine without a GPU: stand-in programs play
# nvidia-smi, compute-sanitizer, the GPU tests and the benchmark. Checks that a failing or skipping
# test fails the run and is named in the summary, that a stage which runs past the deadline is
# stopped (with its grandchildren) and the rest are reported as not run, that the summary and the
# benchmark's JSON come out, and that an unknown stage is refused.
#   gpu_check_test.sh PATH/TO/scripts/gpu_check.sh
set -uo pipefail
check=${1:?usage: gpu_check_test.sh scripts/gpu_check.sh}
work=$(mktemp -d /tmp/headroom-gpu-check-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/path"
fails=0
expect() {  # expect DESCRIPTION COMMAND...: the command must succeed
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what" >&2
    fails=$((fails + 1))
  fi
}

cat >"$work/path/nvidia-smi" <<'EOF'
#!/bin/sh
echo "GPU 0: stand-in"
EOF
cat >"$work/path/compute-sanitizer" <<'EOF'
#!/bin/sh
# --tool TOOL [OPTIONS...] BINARY ARGS...: the options are pairs of words
echo "tool $2"
shift 2
while [ "${1#--}" != "$1" ]; do shift 2; done
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
cat >"$work/path/ncu" <<'EOF'
#!/bin/sh
# Nsight Compute's CSV, details page, for two launches (one row per metric).
echo "==PROF== Connected to process 4242"
echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
k='"void hr::kernels::gemv_kernel<1, (hr::kernels::GemvInput)0>(hr::kernels::GemvParams)"'
row() { echo "\"$1\",\"4242\",\"headroom_gpu_bench\",\"127.0.0.1\",$k,\"1\",\"7\",\"(256, 1, 1)\",\"(768, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"$2\",\"$3\",\"$4\""; }
case "$*" in
  *--moe*)  # decode steps: a GEMV then the sampling kernel, four times
    for id in 0 2 4 6; do
      row $id dram__bytes_read.sum Mbyte 50.33
      row $id gpu__time_duration.sum usecond 21.17
    done
    k='"void hr::kernels::<unnamed>::sample_kernel(float *, int)"'
    for id in 1 3 5 7; do
      row $id dram__bytes_read.sum Mbyte 0.5
      row $id gpu__time_duration.sum usecond 4.83
    done ;;
  *)
    for id in 0 1; do
      row $id dram__bytes_read.sum Mbyte 50.33
      row $id gpu__time_duration.sum usecond 2$id.17
      row $id dram__throughput.avg.pct_of_peak_sustained_elapsed % 6$id.5
    done ;;
esac
EOF
gtest() {  # gtest NAME BODY: a stand-in test binary
  printf '#!/bin/sh\n%s\n' "$2" >"$work/bin/$1"
}
gtest kernels_device_test 'echo "[       OK ] GpuDeviceTest.ListsDevicesWithMemory (1 ms)"'
gtest cuda_kernels_test 'echo "[       OK ] CudaKernelsTest.GemvMatchesReference (1 ms)"
echo "[  SKIPPED ] CudaKernelsTest.SamplingGreedyTopKTopPAndSeeds (0 ms)"
echo "[  SKIPPED ] 1 test, listed below:"
echo "[  SKIPPED ] CudaKernelsTest.SamplingGreedyTopKTopPAndSeeds"'
gtest cuda_sampling_test 'echo "[       OK ] CudaSamplingTest.LogprobsMatchTheHostReference (1 ms)"'
# (On one GPU the experts-on-every-device case must be left out, or it skips.)
gtest cuda_moe_test 'echo "[       OK ] CudaMoeTest.RouteMatchesTheHost (1 ms)"
case "$*" in
  *-*OnEveryDevice*) ;;
  *) echo "[  SKIPPED ] CudaMoeTest.ExpertsRunOnEveryDevice (0 ms)" ;;
esac'
gtest cuda_fixture_models_test 'echo "[       OK ] Fixtures/CudaFixtureTest.LogitsAndGreedyMatchTheCpuAndTransformers/mixtral (1 ms)"'
gtest cuda_collectives_test 'echo "[       OK ] Ranks/VirtualRanksTest.CollectivesEqualTheSerialSumsEagerlyAndInAGraph/2 (1 ms)"'
gtest cuda_peer_collectives_test 'echo "[       OK ] PeerLayerBoundary.EqualsTheVirtualRanksFusedKernel (1 ms)"'
# (On the stand-in's one GPU the one-GPU-a-rank cases must be left out, or they skip.)
gtest cuda_parallel_test 'echo "[       OK ] Models/CudaParallelTest.VirtualRanksEqualOneRank/wide_tp8 (1 ms)"
case "$*" in
  *-*CudaPeerRanks*) ;;
  *) echo "[  SKIPPED ] Models/CudaPeerRanksTest.OneGpuARankOverPeersEqualsVirtualRanks/wide_tp4 (0 ms)" ;;
esac'
gtest cuda_backend_test 'echo "[       OK ] CudaBackendTest.LogitsMatchCpuBackend (1 ms)"
echo "[  FAILED  ] CudaBackendTest.FedTokensEqualKnownTokens (2 ms)"
echo "[  FAILED  ] 1 test, listed below:"
echo "[  FAILED  ] CudaBackendTest.FedTokensEqualKnownTokens"
exit 1'
gtest headroom_gpu_bench 'echo "decode batch 1: 160.0 tok/s"
echo "{\"batch1_mbu\": 0.8, \"decode_tok_s\": {\"1\": 160.0}, \"prefill_tok_s\": 39000.0, \"complete\": true}"'
chmod +x "$work"/bin/* "$work"/path/*

run() {  # run DEADLINE STAGES: gpu_check.sh with the stand-ins; output in $work/out, rc in $rc
  PATH=$work/path:$PATH HEADROOM_PREBUILT=$work/bin HEADROOM_GPU_CHECK_LOGS=$work/logs HEADROOM_BENCH_BASELINE=0 \
    HEADROOM_GPU_CHECK_DEADLINE_S=$1 HEADROOM_GPU_CHECK_STAGES=$2 "$check" >"$work/out" 2>&1
  rc=$?
  sed -n '/== gpu_check summary/,$p' "$work/out" >"$work/summary"
}
has() { grep -qE -- "$1" "$work/summary"; }

# 1. Everything runs: the failing and the skipping test fail the run and are named; the
# benchmark's JSON is the last line and is kept; the sanitizer stages ran their tools.
run 300 tests,bench,sanitize
expect "a failing test fails the run (rc $rc)" test "$rc" -ne 0
expect "the failed test is named" has '^cuda_backend_test +FAILED rc=1 passed=1 skipped=0 .*FedTokensEqualKnownTokens'
expect "a skipped test is counted" has '^cuda_kernels_test +ok passed=1 skipped=1'
expect "the device test passed" has '^kernels_device_test +ok passed=1 skipped=0'
expect "the benchmark's figures are summed up" has '^bench_gpu +ok .*batch1_mbu=0.800'
expect "the benchmark's JSON is the last line" test "$(tail -1 "$work/out" | cut -c1-16)" = '{"batch1_mbu": 0'
expect "bench.json is kept" grep -q '"prefill_tok_s"' "$work/logs/bench.json"
expect "racecheck ran" grep -q 'tool racecheck' "$work/logs/sanitize_racecheck_cuda_kernels.log"
expect "memcheck over the backend failed with its test" has '^sanitize_memcheck_cuda_backend +FAILED'
expect "summary.txt holds the summary" grep -q '^bench_gpu' "$work/logs/summary.txt"
expect "no profile unless named" bash -c "! grep -q profile '$work/summary'"

# 2. A skipped test alone fails the run (on a GPU machine nothing may skip); with only passing
# stages, the run passes.
gtest cuda_backend_test 'echo "[       OK ] CudaBackendTest.LogitsMatchCpuBackend (1 ms)"'
chmod +x "$work"/bin/*
run 300 tests
expect "a skipped test alone fails the run (rc $rc)" test "$rc" -ne 0
gtest cuda_kernels_test 'echo "[       OK ] CudaKernelsTest.GemvMatchesReference (1 ms)"'
chmod +x "$work"/bin/*
run 300 tests,bench
expect "all stages passing pass the run (rc $rc)" test "$rc" -eq 0

# 2b. A benchmark that fails part-way still has its last figures summed up and kept (it prints
# them after each phase), and fails the run.
gtest headroom_gpu_bench 'echo "{\"batch1_mbu\": 0.7, \"decode_tok_s\": {\"1\": 150.0}, \"complete\": false}"
echo "gpu_bench: prefill: out of memory" >&2
exit 1'
chmod +x "$work"/bin/*
run 300 bench
expect "a failed benchmark fails the run (rc $rc)" test "$rc" -ne 0
expect "its figures so far are summed up" has '^bench_gpu +FAILED rc=1 .*batch1_mbu=0.700 .*complete=False'
expect "and kept" grep -q '"complete": false' "$work/logs/bench.json"

# 3. A test that hangs (with a child of its own) is stopped at the deadline; the stages after it
# are reported as not run; the run fails and still prints its summary.
gtest cuda_kernels_test 'sleep 600 & echo $! >"'"$work"'/grandchild"; wait'
chmod +x "$work"/bin/*
start=$(date +%s)
run 40 tests,bench
took=$(( $(date +%s) - start ))
expect "the run ends near its deadline (${took}s)" test "$took" -lt 70
expect "a hung stage fails the run" test "$rc" -ne 0
expect "the hung test is reported stopped" has '^cuda_kernels_test +STOPPED: out of time'
expect "later stages are reported not run" has '^bench_gpu +NOT RUN: out of time'
# (gone, or a zombie waiting to be reaped)
expect "the hung test started its child" test -s "$work/grandchild"
expect "the hung test's child was stopped too" \
  bash -c "case \$(ps -o stat= -p \$(cat '$work/grandchild')) in ''|Z*) true ;; *) false ;; esac"

# 3b. The script interrupted (TERM) while a stage runs: the stage and its children stop with it.
gtest cuda_kernels_test 'sleep 600 & echo $! >"'"$work"'/grandchild2"; wait'
chmod +x "$work"/bin/*
PATH=$work/path:$PATH HEADROOM_PREBUILT=$work/bin HEADROOM_GPU_CHECK_LOGS=$work/logs \
  HEADROOM_GPU_CHECK_STAGES=tests "$check" >"$work/out" 2>&1 &
checker=$!
for _ in $(seq 100); do [ -s "$work/grandchild2" ] && break; sleep 0.1; done
expect "the interrupted stage started its child" test -s "$work/grandchild2"
kill -TERM "$checker"
wait "$checker"
rc=$?
expect "an interrupted run exits 130 (rc $rc)" test "$rc" -eq 130
expect "an interrupted run prints its summary" grep -q '^gpu_check interrupted' "$work/out"
sleep 1
expect "the interrupted stage's child was stopped too" \
  bash -c "case \$(ps -o stat= -p \$(cat '$work/grandchild2')) in ''|Z*) true ;; *) false ;; esac"

# 4. The profile stage (only when named) sums up Nsight Compute's CSV a launch a line: 50.33 MB
# in 21.17 us is 2,377 GB/s.
run 300 profile
expect "the profile stage passes (rc $rc)" test "$rc" -eq 0
expect "the profile is summed up a launch a line" \
  has '^  1 +gemv_kernel<1, \(hr::kernels::GemvInput\)0 +grid \(768, 1, 1\) +21\.2 us +50\.3 MB read +2377 GB/s +dram +61\.5%'
expect "the first launch too" has '^  0 +gemv_kernel.* +20\.2 us .* 2495 GB/s'
expect "the MoE decode steps are summed up per step" has '^  kernels per step: 2 launches, 26\.0 us'

# 4b. The flex stage (only when named) needs Postgres and Redis: with prebuilt binaries and no
# portable pack it is reported skipped, and runs nothing.
HEADROOM_PORTABLE= run 300 flex
expect "the flex stage is taken (rc $rc)" test "$rc" -eq 0
expect "without the services it says so" has '^flex +skipped: no Postgres/Redis'

# 4c. The load stage (only when named) writes the checkpoint when it is missing, then sums up the
# load benchmark's figures against the disk's.
gtest headroom_engine_bench 'mkdir -p "$2" && echo weights >"$2/model.safetensors"'
gtest headroom_cuda_load_bench 'echo "{\"disk_cold_read_gbs\": 2.5, \"over_disk\": {\"one_rank_cold\": 0.8}}"'
chmod +x "$work"/bin/*
export HEADROOM_LOAD_MODEL=$work/model
run 300 load
expect "the load stage passes (rc $rc)" test "$rc" -eq 0
expect "the checkpoint was written and moved into place" test -f "$work/model/model.safetensors"
expect "the checkpoint's writing is summed up" has '^load_model +ok'
expect "the load figures are summed up" has '^load +ok .*disk 2.50 GB/s; over disk: \{"one_rank_cold": 0.8\}'
expect "load.json is kept" grep -q over_disk "$work/logs/load.json"
# A folder that is there (a sharded checkpoint, say) is loaded as it is, never written into.
mkdir -p "$work/sharded"
touch "$work/sharded/model-00001-of-00002.safetensors"
export HEADROOM_LOAD_MODEL=$work/sharded
run 300 load
expect "an existing folder is not written into" test ! -e "$work/sharded/model.safetensors"
expect "no checkpoint is written for it" bash -c "! grep -q '^load_model' '$work/summary'"
unset HEADROOM_LOAD_MODEL

# 5. An unknown stage is refused before anything runs.
run 300 tests,benchmark
expect "an unknown stage is refused with 2 (rc $rc)" test "$rc" -eq 2
expect "the refusal names the stage" grep -q "unknown stage 'benchmark'" "$work/out"

if [ "$fails" -ne 0 ]; then
  echo "--- last output:" >&2
  cat "$work/out" >&2
  exit 1
fi
echo "gpu_check_test: all checks passed"
