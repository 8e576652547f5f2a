#!/usr/bin/env bash
# Issue #32, SmolLM2's shape at batch 16 under a grammar (goal: within 5% of free). The served fill is a pool of
# 8 threads over 8 lanes (chat/grammar.Grammars(lanes=), runner/options.auto_grammar_threads); on the items grammar
# a step's fill is set by its costliest rows (~0.3 ms each on a 2-core EPYC: a string under `[a-z ]{4,24}`, where
# 33k of the 49k tokens are allowed and llguidance's slices do not apply; most rows take 5-10 us).
#
#   STAGES="regress lanes split" OUT=$OUT bash bench/results/gpu_fill_lanes/run.sh   # call 1; carry .whl, .cache/smollm2-tokenizer
#   STAGES="serve ab" OUT=$OUT bash bench/results/gpu_fill_lanes/run.sh               # call 2: 16 lanes served
#   PROCESS=1 SWITCHES= STAGES="gil ab regress" OUT=$OUT bash bench/results/gpu_fill_lanes/run.sh   # call 3: the fill
#   in a process (a prototype then, bench/grammar_fill_process.py and --process-fill of 7ec1006) beside the fill thread
#   AB_SHAPES=smollm2-135m AB_ROUNDS=5 PROCESS=1 SWITCHES= STAGES=ab OUT=$OUT bash ...run.sh   # call 4: the same, the
#   prototype's row table written at once (its tree: 02e46ae)
#   AB_SHAPES=smollm2-135m AB_ROUNDS=5 SWITCHES= STAGES="serve ab prefill" OUT=$OUT bash ...run.sh   # call 5: the
#   fill process the GPU's default (--grammar-fill auto), served and in the ab; the 8k prefill's profile (the ab
#   lost: a collected masker's segment stayed registered with CUDA, refusing the next one's pin)
#   AB_SHAPES=smollm2-135m AB_ROUNDS=5 SWITCHES= STAGES="ab regress" OUT=$OUT bash ...run.sh   # call 6: mended
#   DEADLINE=200 AB_SHAPES=smollm2-135m AB_ROUNDS=3 SWITCHES= STAGES="ab masks" OUT=$OUT bash ...run.sh   # call 7 (an
#   H100): the ab with our llguidance slices (SLICES in chat/grammar.py; a fill thread on the general ones beside) and
#   the GPU's mask tests (a fill process pinned after another). Next: AB_SHAPES=llama-8b STAGES="ab prefill" (the
#   8B's served process, the prefill's host share), not run (the device time ran out)
#   DEADLINE=520 AB_SHAPES=smollm2-135m,llama-8b AB_ROUNDS=3 SWITCHES= STAGES="ab prefill" OUT=$OUT bash ...run.sh   # call 8:
#   the ab with the mirrors' tokens through llguidance's pool (ProcessMasker.CONSUME_PAR) at batch 16
#   DEADLINE=470 AB_SHAPES=llama-8b,smollm2-135m AB_ROUNDS=3 SWITCHES= STAGES="prefill ab masks" OUT=$OUT bash ...run.sh
#   # call 9: the prefill's last layer on last rows against every row, the host's runtime calls; the 8B's process
#   DEADLINE=480 PREFILL_ROUNDS=5 AB_SHAPES=smollm2-135m AB_ROUNDS=4 SWITCHES= STAGES="prefill regress ab" OUT=$OUT bash ...run.sh
#   # call 10: the prefill's KV write in rope_split and Triton add + norm against the torch glue; every test_cuda*.py
#   DEADLINE=400 PREFILL_ROUNDS=5 AB_SHAPES=smollm2-135m AB_ROUNDS=4 SWITCHES= STAGES="prefill ab masks" OUT=$OUT bash ...run.sh
#   # call 11: the same alternation 1 s apart, the GPU's clocks sampled, kernels alone 150 back to back; the fill
#   process's early tokens (ProcessMasker.EARLY) against the tokens after the host's turn
#   DEADLINE=300 AB_SHAPES=smollm2-135m AB_ROUNDS=5 SWITCHES= STAGES="ab masks" OUT=$OUT bash ...run.sh
#   # call 12: the same ab, an early token the mirror's alone (the engine's done reads the mirror's word)
#   DEADLINE=150 AB_SHAPES=smollm2-135m AB_ROUNDS=3 SWITCHES= STAGES=ab OUT=$OUT bash ...run.sh   # call 13: the
#   same through the split bench (bench/engine_cuda_grammar.py)
#   DEADLINE=560 AB_BATCHES=16,1 AB_SHAPES=smollm2-135m AB_ROUNDS=3 AB_POOLS= SWITCHES= STAGES="ab regress" \
#   AB_ONLY="grammar;grammar, process, pinned;grammar, process, one lane;grammar, process, one lane, pinned" ...run.sh
#   # call 20: the loop thread and the fill process pinned (--pin-cpus on since), the mirrors from one compilation
#   DEADLINE=320 AB_BATCHES=16,1 AB_SHAPES=smollm2-135m AB_ROUNDS=3 AB_POOLS= SWITCHES= STAGES="ab masks" \
#   AB_ONLY="grammar;grammar, warm;grammar, warm, pinned" ...run.sh   # call 21: the served steady state (warm);
#   calls 22-24: AB_ONLY="grammar;grammar, warm;grammar, tool calls;grammar, warm, tool calls" STAGES=ab
#
# regress: every GPU test (bench/gpu_check.sh tests);
# lanes:   SmolLM2 batch 16, free and served and the pools of $POOLS (TxL: T threads over L lanes; a t: the
#          tool-call grammar), alternated over three rounds (bench/engine_cuda.py --mask-threads-ab);
# rowcosts: the host's llguidance alone (bench/grammar_fill_threads.py): each row's fill under the served
#          slices and a slice per length, the fill's pools of 1, 8 and 16 threads (POOLS_TOO=1), and the fill
#          split over 1, 2 and 4 processes (bench/grammar_fill_procs.py);
# split:   the host's turn by part at SmolLM2 batch 16, free, items and tool calls (engine_cuda_profile --host-split);
# prefill: the 8B shape's 8k-token prefill by part (GEMMs, attention, the rest) and SDPA's kernels on one
#          layer's attention (bench/engine_cuda_profile.py --prefill);
# masks:   the GPU's mask tests (test_structured's, test_grammar_process's) and test_cuda_serve.py (of regress's);
# gil:     bench/gil_handoff.py (a hand-over between two Python threads);
# full:    ours and the compiled peer at batches 1, 16, 64 (both shapes), grammar at 1 and 16;
# serve:   tests/engine/test_cuda_serve.py (the served engine on the GPU: /health's lanes, the fill pool);
# ab:      grammar / free at batch 1 and 16, SmolLM2's and the 8B's shape, items and tool calls, the served fill
#          against in line, one fill thread, 8 threads over 8 lanes (call 1's served: $AB_POOLS) and GIL switch
#          intervals of $SWITCHES us, alternated (three rounds; $AB_ROUNDS).
# Everything lands in $OUT/all.tgz (one file back); progress in its run.log.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_fill_lanes  # out, PY, log, left, stage, regress, engine_bench, pack
for s in ${STAGES:-regress lanes split}; do
  case $s in
    regress) regress ;;
    gil) stage gil  # what a hand-over between two Python threads costs on this host (bench/gil_handoff.py)
      timeout 60 $PY bench/gil_handoff.py >"$out/gil.log" 2>&1; echo "gil rc=$?" | tee -a "$log"; tee -a "$log" <"$out/gil.log" ;;
    full) BATCHES=1,16,64 engine_bench smollm2-135m,llama-8b 1,16 ;;  # ours and the compiled peer (TOOLS=1: tool calls)
    masks) stage masks
      timeout "$(( $(left) < 200 ? $(left) - 5 : 200 ))" $PY -m pytest -q -p no:cacheprovider -rs tests/engine/test_cuda_serve.py \
        tests/engine/test_structured.py::test_gpu_masks_equal_the_cpu_kernel \
        tests/engine/test_grammar_process.py::test_gpu_fill_processes_one_after_another_mask_as_the_cpu_does >"$out/masks.log" 2>&1
      echo "masks rc=$?" | tee -a "$log"; tail -n 3 "$out/masks.log" | tee -a "$log" ;;
    serve) stage serve
      timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_serve.py \
        >"$out/serve.log" 2>&1
      echo "serve rc=$?" | tee -a "$log"; tail -n 2 "$out/serve.log" | tee -a "$log" ;;
    ab) stage ab
      timeout "$(( $(left) < 260 ? $(left) - 5 : 260 ))" $PY bench/engine_cuda.py --shapes "${AB_SHAPES:-smollm2-135m,llama-8b}" \
        --batches= --grammar-batches "${AB_BATCHES:-1,16}" --grammar-rounds "${AB_ROUNDS:-3}" ${AB_ONLY:+--grammar-only "$AB_ONLY"} --grammar-ab --switch-ab "${SWITCHES-50,20}" --grammar-tools \
        --mask-threads-ab "${AB_POOLS:-8x8}" --tokens 64 --skip-transformers --peer-batches= --ttft= --parts-batches= \
        --budget-s 250 --out "$out/ab" \
        >"$out/ab.log" 2>&1
      echo "ab rc=$?" | tee -a "$log"; grep -E "^\| (smollm2|llama)" "$out/ab/engine_cuda.md" | tail -n 16 | tee -a "$log" ;;
    lanes) stage lanes
      timeout "$(( $(left) < 170 ? $(left) - 5 : 170 ))" $PY bench/engine_cuda.py --shapes smollm2-135m --batches= \
        --grammar-batches 16 --grammar-rounds 3 --grammar-tools --tokens 64 --skip-transformers --peer-batches= --ttft= \
        --parts-batches= --mask-threads-ab "${POOLS:-8x16,12x12,16x16,8x8t,16x16t}" --budget-s 160 --out "$out/lanes" \
        >"$out/lanes.log" 2>&1
      echo "lanes rc=$?" | tee -a "$log"; grep -E "^\| smollm2" "$out/lanes/engine_cuda.md" | tail -n 12 | tee -a "$log" ;;
    prefill) stage prefill
      timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda_profile.py --shape llama-8b \
        --prefill "${PREFILL:-8192}" --prefill-rounds "${PREFILL_ROUNDS:-3}" >"$out/prefill.log" 2>&1
      echo "prefill rc=$?" | tee -a "$log"; tail -n 45 "$out/prefill.log" | tee -a "$log" ;;
    rowcosts) stage rowcosts  # the host's llguidance alone: each row's fill under both slice sets, then the pools
      for sl in served by-length; do
        timeout 90 $PY bench/grammar_fill_threads.py --row-costs --slices $sl >"$out/rowcosts_$sl.log" 2>&1
      done
      [ -n "${POOLS_TOO:-}" ] && timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/grammar_fill_threads.py \
        --threads 1,8,16 --rounds 3 >"$out/pools.log" 2>&1
      timeout 120 $PY bench/grammar_fill_procs.py --procs 1,2,4 --rounds 3 >"$out/procs.log" 2>&1
      echo "rowcosts rc=$?" | tee -a "$log"; cat "$out"/rowcosts_*.log "$out"/pools.log "$out"/procs.log 2>/dev/null | grep -v "fills over" | tee -a "$log" ;;
    split) stage split
      timeout "$(( $(left) < 120 ? $(left) - 5 : 120 ))" $PY bench/engine_cuda_profile.py --shape smollm2-135m \
        --batch 16 --tokens 400 --host-split free,items,tools --rounds 2 >"$out/split.log" 2>&1
      echo "split rc=$?" | tee -a "$log"; grep -E "^## |tok/s|fill|masks|accept|output" "$out/split.log" | tail -n 40 | tee -a "$log" ;;
  esac
done
pack  # everything in $out/all.tgz
