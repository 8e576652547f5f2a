#!/usr/bin/env bash
# Issue #32's 8k TTFT goal (<= 180 ms, Llama-8B shape, one H200) with --prefill-fp8, in one device call
# (carry .whl from `bash bench/wheelhouse.sh 3.12 .whl` and .cache/smollm2-tokenizer from
# `bash bench/gpu_check.sh prepare`):
#
#   bash bench/results/gpu_fp8/run.sh                      # STAGES="tests bench" (default)
#   STAGES="tests bench regress" bash bench/results/gpu_fp8/run.sh   # + the other GPU tests (gpu_check.sh tests)
#
# tests:   tests/engine/test_cuda_fp8.py compiled on the GPU: the quantisation kernels against torch, the FP8
#          matmul, the routing, the start-up check, SmolLM2-shaped random weights' 2 x 4160-token prefill FP8 vs
#          bf16, `engine serve --prefill-fp8`. The real-SmolLM2 tests are deselected: its GGUF (98 MB) cannot
#          travel, and the device has no network (they run on CPU in CI).
# bench:   bench/engine_cuda.py --ttft-fp8 8192 on the 8B shape: the 8k prefill's TTFT with the projections in
#          bf16, FP8 and FP8 with fast accumulation, alternated FP8_ROUNDS times, medians, and the last position's
#          top-1 against bf16's over random prompts.
# regress: bench/gpu_check.sh tests (test_cuda*.py, the grammar's and async decode's GPU halves).
# Each stage under `timeout`, the whole within DEADLINE seconds; logs and tables go to $OUT.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_fp8  # out, PY, log, left, stage; the packages; the versions
for s in ${STAGES:-tests bench}; do
  case $s in
    tests) stage tests
      timeout 240 $PY -m pytest -q -p no:cacheprovider -rs -s --durations=10 tests/engine/test_cuda_fp8.py -k "not real_smollm2" \
        >"$out/fp8_tests.log" 2>&1; echo "tests rc=$?" | tee -a "$log"
      grep -E "FP8 prefill vs bf16|passed|failed|error" "$out/fp8_tests.log" | tail -n 6 | tee -a "$log" ;;
    bench) stage bench
      timeout "$(( $(left) < 300 ? $(left) : 300 ))" $PY bench/engine_cuda.py --shapes llama-8b --batches 1 --tokens 16 \
        --ttft= --ttft-fp8 8192 --fp8-rounds "${FP8_ROUNDS:-5}" --fp8-prompts 8 --skip-transformers --peer-batches= \
        --budget-s 280 --out "$out" --name engine_cuda_fp8 >/dev/null 2>&1
      echo "bench rc=$?" | tee -a "$log"; grep -E "fp8|ttft|round" "$out/engine_cuda_fp8.log" | tee -a "$log" ;;
    regress) regress ;;
  esac
done
stage done
