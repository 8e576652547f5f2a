#!/usr/bin/env bash
# Issue #32's SmolLM2 batch-1 goal (>= 2,500 tok/s, one H200): a one-row step's layers in one persistent
# launch (bench/persistent_kernel.py, the cuda-persistent variant), in one device call (carry .whl from
# `bash bench/wheelhouse.sh 3.12 .whl` and .cache/smollm2-tokenizer from `bash bench/gpu_check.sh prepare`):
#
#   STAGES="tests profile bench" bash bench/results/gpu_persistent/run.sh
#
# barrier:  bench/grid_barrier.py: what one grid-wide barrier costs, polled with loads or with atomics.
# tests:    tests/engine/test_cuda_persistent.py compiled (one launch with its barriers against the five kernels a
#           layer, the counters left at zero, the decoder in graphs), then test_cuda_kernels.py and test_cuda.py.
# profile:  bench/engine_cuda_profile.py --kernels 16 on SmolLM2 at batch 1: cuda (five kernels a layer) and cuda-persistent
#           (the persistent kernel), each its unprofiled rate and its kernels.
# stages:   bench/persistent_stages.py at contexts of $STAGE_PROMPTS: each stage's time, program 0's clock.
# regress:  bench/gpu_check.sh tests (every GPU test).
# bench:    bench/engine_cuda.py, ours and the compiled peer in one run, at batches $BATCHES (+ grammar).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_persistent  # out, PY, log, left, stage; the packages; the versions
BATCHES=${BATCHES:-1,16}
for s in ${STAGES:-tests profile bench}; do
  case $s in
    barrier) stage barrier
      timeout 60 $PY bench/grid_barrier.py --barriers 3000 2>&1 | tee "$out/barrier.log" | tee -a "$log" ;;
    tests) stage tests
      timeout 150 $PY -m pytest -q -p no:cacheprovider -rs -x --durations=5 tests/engine/test_cuda_persistent.py \
        >"$out/tests_persistent.log" 2>&1; echo "persistent tests rc=$?" | tee -a "$log"
      tail -n 15 "$out/tests_persistent.log" | tee -a "$log"
      [ "${PERSISTENT_ONLY:-}" ] && continue
      timeout "${TESTS_S:-200}" $PY -m pytest -q -p no:cacheprovider -rs -x --durations=5 tests/engine/test_cuda_kernels.py \
        tests/engine/test_cuda.py >"$out/tests.log" 2>&1; echo "tests rc=$?" | tee -a "$log"
      tail -n 3 "$out/tests.log" | tee -a "$log" ;;
    stages) stage stages
      for n in ${STAGE_PROMPTS:-128 1000}; do
        timeout 120 $PY bench/persistent_stages.py --prompt "$n" 2>&1 | tail -n 12 | tee "$out/stages_$n.log" | tee -a "$log"
      done ;;
    profile) stage profile
      timeout 170 $PY bench/engine_cuda_profile.py --shape smollm2-135m --batch 1 --tokens 64 --kernels 16 \
        --backends "${PROFILE_BACKENDS:-cuda,cuda-persistent}" --out "$out" >"$out/profile.log" 2>&1
      echo "profile rc=$?" | tee -a "$log"; grep -E "^## |steps:" "$out"/kernels_*.md | tee -a "$log" ;;
    regress) regress ;;
    bench) engine_bench smollm2-135m "1" ;;
  esac
done
stage done
