#!/usr/bin/env bash
# Issue #32's grammar goal on one H200, in one device call (bench/results/gpu_grammar2/README.md):
#
#   bash bench/results/gpu_grammar2/run.sh    # carry .whl, .cache/smollm2-tokenizer, .before
#
# after:  bench/engine_cuda.py on this tree: free and grammar decoding alternated 3 times at batch 1
#         and 16 on both shapes, medians, and (--grammar-ab) the masks filled in line and/or masked by
#         torch's ops in the same rounds: the paired A/B of the two changes (call 1: the fill ahead on
#         by default, its variant "fill in line"; call 2: in line by default, the variant "fill ahead");
# before: the same bench on the tree before them (.before: `git archive` of its commit; one round);
# tests:  bench/gpu_check.sh tests (test_cuda*.py, test_structured's and test_async_decode's GPU half).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_grammar2  # out, PY, log, left, stage; the packages; the versions
args=(--shapes llama-8b,smollm2-135m --grammar-batches 1,16 --tokens 128 --skip-transformers --peer-batches= --ttft=)
stage after
timeout 230 $PY bench/engine_cuda.py "${args[@]}" --batches= --grammar-rounds 3 --grammar-ab --budget-s 215 \
  --out "$out/after" >"$out/after.log" 2>&1; echo "after rc=$?" | tee -a "$log"
grep -E "decode_tok_s|bandwidth" "$out/after.log" | tee -a "$log"
stage before
(cd .before && PYTHONPATH="$PWD" timeout "$(( $(left) < 170 ? $(left) : 170 ))" $PY bench/engine_cuda.py "${args[@]}" --batches=1,16 \
  --budget-s 155 --out "$out/before" >"$out/before.log" 2>&1); echo "before rc=$?" | tee -a "$log"
grep -E "decode_tok_s|bandwidth" "$out/before.log" | tee -a "$log"
[ "${TESTS:-1}" = 1 ] || { stage done; exit 0; }
stage tests
OUT="$out/tests" PYTHON=$PY timeout "$(( $(left) - 5 ))" bash bench/gpu_check.sh tests >/dev/null 2>&1
echo "tests rc=$?" | tee -a "$log"; tail -n 3 "$out/tests/gpu_tests.log" | tee -a "$log"
stage done
