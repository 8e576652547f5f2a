#!/usr/bin/env bash
# Issue #32's SmolLM2 batch-1 goal (>= 2,500 tok/s, one H200): the decode kernels launched with
# programmatic dependent launch (PDL), in one device call (carry .whl from `bash bench/wheelhouse.sh 3.12 .whl`
# and .cache/smollm2-tokenizer from `bash bench/gpu_check.sh prepare`):
#
#   STAGES="tests sweep profile" bash bench/results/gpu_pdl/run.sh
#
# tests:   tests/engine/test_cuda_kernels.py compiled (PDL chains against serial launches, eager and in a graph)
#          and tests/engine/test_cuda.py (the GPU decoder, PDL on, against the CPU engine).
# sweep:   bench/engine_cuda_sweep.py on both shapes at batches $BATCHES: the served backend (PDL on), cuda-no-pdl
#          and $EXTRA backends, $ROUNDS times (the backends in turn each round).
# profile: bench/engine_cuda_profile.py --kernels 24 on SmolLM2 at batch 1, PDL on and off.
# profiles: the same for each shape:batch of $PROFILES, the backends of $PROFILE_BACKENDS.
# ab:      SmolLM2's decode rate at batches $AB_BATCHES, this tree and .before (carry a worktree of the tree before),
#          alternated $AB_ROUNDS times (bench/engine_cuda_profile.py without --kernels: async decode, 120 tokens
#          after a 128-token prompt: one span bucket, no graph captured while timed).
# regress: bench/gpu_check.sh tests (every GPU test).
# bench:   bench/engine_cuda.py, ours and the compiled peer in one run, at batches 1,16 (+ grammar).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_pdl  # out, PY, log, left, stage; the packages; the versions
BATCHES=${BATCHES:-1,16}
for s in ${STAGES:-tests sweep profile}; do
  case $s in
    tests) stage tests
      timeout 240 $PY -m pytest -q -p no:cacheprovider -rs -x --durations=5 tests/engine/test_cuda_kernels.py \
        tests/engine/test_cuda.py >"$out/tests.log" 2>&1; echo "tests rc=$?" | tee -a "$log"
      tail -n 3 "$out/tests.log" | tee -a "$log" ;;
    sweep) stage sweep
      for r in $(seq "${ROUNDS:-2}"); do
        timeout "$(( $(left) < 240 ? $(left) : 240 ))" $PY bench/engine_cuda_sweep.py --shapes "${SHAPES:-smollm2-135m,llama-8b}" \
          --batches "$BATCHES" --parts-batches "${PARTS:-}" --tokens "${TOKENS:-128}" \
          --backends "cuda,cuda-no-pdl${EXTRA:+,$EXTRA}" --budget-s 220 --out "$out/sweep$r" >"$out/sweep$r.log" 2>&1
        echo "sweep $r rc=$?" | tee -a "$log"; grep -E "^\| (smollm|llama)" "$out/sweep$r/"*.md 2>/dev/null | tee -a "$log"
      done ;;
    profile) stage profile
      timeout 150 $PY bench/engine_cuda_profile.py --shape smollm2-135m --batch 1 --kernels 24 \
        --backends "${PROFILE_BACKENDS:-cuda,cuda-no-pdl}" --out "$out" >"$out/profile.log" 2>&1
      echo "profile rc=$?" | tee -a "$log"; grep -iE "step|busy|idle" "$out"/kernels_*.md | head -n 12 | tee -a "$log" ;;
    profiles) stage profiles  # PROFILES="shape:batch ...", each with PROFILE_BACKENDS
      for sb in ${PROFILES:-llama-8b:16}; do
        timeout 170 $PY bench/engine_cuda_profile.py --shape "${sb%%:*}" --batch "${sb##*:}" --kernels 16 \
          --backends "${PROFILE_BACKENDS:-cuda,cuda-no-pdl}" --out "$out" >"$out/profile_${sb%%:*}_${sb##*:}.log" 2>&1
        echo "profile $sb rc=$?" | tee -a "$log"
        grep -E "^## |steps:" "$out/kernels_${sb%%:*}_b${sb##*:}.md" | tee -a "$log"
      done ;;
    ab) stage ab  # this tree against .before (a worktree of the tree before), decode rates alternated
      for r in $(seq "${AB_ROUNDS:-3}"); do
        for b in ${AB_BATCHES:-1 16}; do
          for tree in . .before; do
            t=$( (cd "$tree" && PYTHONPATH="$PWD" timeout 60 $PY bench/engine_cuda_profile.py --shape smollm2-135m --batch "$b" --tokens 120 \
              2>&1 | grep -E "tok/s" | tail -n 1) )
            echo "round $r b=$b $([ "$tree" = . ] && echo this || echo before): $t" | tee -a "$log"
          done
        done
      done ;;
    regress) regress ;;
    bench) engine_bench llama-8b,smollm2-135m "" ;;
  esac
done
stage done
