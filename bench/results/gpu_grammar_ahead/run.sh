#!/usr/bin/env bash
# Issue #32's grammar goal (within 5% of free decoding at batch 1 and 16): the masks filled ahead on the
# masker's thread, the masking kernel waiting on the GPU for the fill's ticket (chat/grammar.GrammarMasker,
# backends/cuda/token_mask.py), against the in-line fill, in one process, alternated (ahead served after call 5).
#
#   STAGES="tests ab" OUT=$OUT bash bench/results/gpu_grammar_ahead/run.sh   # carry .whl, .cache/smollm2-tokenizer
#
# tests: the mask kernel's and the masker's GPU tests (the waiting kernel, the masks filled ahead);
# ab:    bench/engine_cuda.py --grammar-ab: free / grammar (the tree's fill) / the other fill, alternated
#        3 times at batch 1 and 16 ($AB_SHAPES, SmolLM2's and the 8B's shape);
# profile: the GPU's kernels a step under the grammar, in line / ahead ($PROFILES: shape:batch ...);
# split: the host's turn by part at SmolLM2 batch 1 (engine_cuda_profile.py --host-split free,items);
# regress: every GPU test (regress-ahead: with GrammarMasker.AHEAD on in the device's copy, as served now); full: ours and the compiled peer ($FULL_SHAPES).
# Everything lands in $OUT/all.tgz (one file back); progress in its run.log.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_grammar_ahead  # out, PY, log, left, stage, regress, engine_bench, pack
for s in ${STAGES:-tests ab}; do
  case $s in
    tests) stage tests
      timeout 200 $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_kernels.py -k "grammar_mask" \
        tests/engine/test_structured.py >"$out/tests.log" 2>&1
      echo "tests rc=$?" | tee -a "$log"; tail -n 3 "$out/tests.log" | tee -a "$log" ;;
    ab) stage ab
      timeout "$(( $(left) < 330 ? $(left) - 5 : 330 ))" $PY bench/engine_cuda.py --shapes "${AB_SHAPES:-smollm2-135m,llama-8b}" \
        --batches= --grammar-batches 1,16 --grammar-rounds "${ROUNDS:-3}" --grammar-ab --tokens 64 \
        --skip-transformers --peer-batches= --ttft= --budget-s 320 --out "$out/ab" >"$out/ab.log" 2>&1
      echo "ab rc=$?" | tee -a "$log"; grep -E "^\|" "$out/ab/engine_cuda.md" | tee -a "$log" ;;
    split) stage split
      timeout 120 $PY bench/engine_cuda_profile.py --shape smollm2-135m --batch "${SPLIT_BATCH:-1}" --tokens 400 \
        --host-split free,items --rounds 2 >"$out/split.md" 2>&1
      echo "split rc=$?" | tee -a "$log"; tail -n 40 "$out/split.md" | tee -a "$log" ;;
    profile) stage profile  # the GPU's kernels a step under the items grammar: filled ahead / in line, alternated
      for sb in ${PROFILES:-llama-8b:1 llama-8b:16 smollm2-135m:16}; do
        timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda_profile.py --shape "${sb%%:*}" \
          --batch "${sb##*:}" --grammar items --kernels 24 --backends cuda,cuda+inline-masks,cuda,cuda+inline-masks \
          --out "$out/prof_${sb/:/_b}" >"$out/prof_${sb/:/_b}.log" 2>&1
        echo "profile $sb rc=$?" | tee -a "$log"
        grep -hE "^## |steps:|_bitmask|_argmax" "$out/prof_${sb/:/_b}"/kernels_*.md | tee -a "$log"
      done ;;
    regress) regress ;;
    regress-ahead)  # every GPU test with the masks filled ahead by default (this copy of the tree only)
      sed -i 's/^    AHEAD = False /    AHEAD = True /' switchyard/engine/chat/grammar.py
      grep -n "^    AHEAD = " switchyard/engine/chat/grammar.py | tee -a "$log"; regress ;;
    full) BATCHES=1,16,64 engine_bench "${FULL_SHAPES:-smollm2-135m,llama-8b}" 1,16 ;;
  esac
done
pack  # everything in $out/all.tgz
