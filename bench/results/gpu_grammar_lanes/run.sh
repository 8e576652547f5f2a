#!/usr/bin/env bash
# Issue #32's SmolLM2 batch-16 grammar goal on one H200: do grammar lanes (chat/grammar.Grammars(lanes=N),
# GrammarMasker(threads=N)) shorten the host's fill on its 16 cores, and what do they do to a decode step?
# Run on 2026-12-06 (README.md has the figures; the lanes lost in the served loop and were taken out, so
# --mask-threads-ab 8 now measures llguidance's pool over copies of one compilation instead).
#
#   STAGES="fill rounds regress" bash bench/results/gpu_grammar_lanes/run.sh   # carry .whl, .cache/smollm2-tokenizer
#
# fill:    bench/grammar_fill_threads.py on the host's cores (no GPU): the fill a step by layout, 1-8 threads;
# rounds:  bench/engine_cuda.py, free / grammar / tool-call grammar / a pool of 8 with 8 lanes, alternated
#          3 times at batch 1 and 16 on SmolLM2's shape (and the 8B's for the lanes' cost at a long step);
# regress: every GPU test (bench/gpu_check.sh tests).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_grammar_lanes  # out, PY, log, left, stage, regress; the packages; the versions
for s in ${STAGES:-fill rounds regress}; do
  case $s in
    fill)
      stage fill
      timeout 120 $PY bench/grammar_fill_threads.py --threads 1,2,4,8 --rounds 5 >"$out/fill.log" 2>&1
      echo "fill rc=$?" | tee -a "$log"; tail -n 20 "$out/fill.log" | tee -a "$log" ;;
    rounds)
      stage rounds
      timeout "$(( $(left) < 300 ? $(left) - 5 : 300 ))" $PY bench/engine_cuda.py --shapes smollm2-135m,llama-8b \
        --batches= --grammar-batches 1,16 --grammar-rounds 3 --grammar-tools --mask-threads-ab 8 --tokens 64 \
        --skip-transformers --peer-batches= --ttft= --budget-s 280 --out "$out" >"$out/rounds.log" 2>&1
      echo "rounds rc=$?" | tee -a "$log"; grep -E "^\|" "$out/engine_cuda.md" | tee -a "$log" ;;
    regress) regress ;;
  esac
done
stage done
