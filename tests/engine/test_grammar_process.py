"""The grammar masks filled by a process of their own (chat/grammar_process, a GPU replica's default
fill): its masks against the in-line fill's, on CPU logits (the waiting kernel interpreted) and on the
GPU; its failures on the engine's thread; its close. The served form: test_structured's
test_a_fill_process_gives_the_fill_threads_replies, and test_cuda_serve on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_support import TOOLS, smollm2_grammars


def _two_grammars_two_maskers() -> tuple[Any, list[Any], Any, Any]:
    """SmolLM2's Grammars, two constraints (a tool call; a JSON object whose string has a pattern), a
    fill process (unpinned: CPU logits, its waiting kernel interpreted) and the in-line fill to hold it to."""
    from switchyard.engine.chat.grammar import GrammarMasker
    from switchyard.engine.chat.grammar_process import ProcessMasker
    from switchyard.engine.chat.structured import constraint

    tok, grammars = smollm2_grammars()
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{2,8}$"}}, "required": ["city"]}}}}
    cs = [constraint({"tool_choice": "required"}, TOOLS), constraint(rf, None)]
    proc = ProcessMasker(tok.vocab_size, tok.tok.to_str(), sorted(tok.eos_ids), threads=2, lanes=2, max_rows=8,
                         pinned=False)
    return grammars, cs, proc, GrammarMasker(tok.vocab_size, ahead=False)


def _mask_both(proc: Any, line: Any, rows: list[Any], g: torch.Generator) -> torch.Tensor:
    """The same random logits masked by the fill process and by the in-line fill, row i under rows[i]'s
    pair of states (the process's, the in-line one's; None: a free row); the masks must be equal.
    Returns the process's masked logits."""
    x = torch.randn(len(rows), proc.vocab_size, generator=g)
    y = x.clone()
    proc.apply(x, [None if r is None else r[0] for r in rows])
    line.apply(y, [None if r is None else r[1] for r in rows])
    proc.wait()
    assert torch.equal(x, y)
    return x


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_gpu_fill_processes_one_after_another_mask_as_the_cpu_does() -> None:
    """A fill process's segment pinned in place for the GPU (a GPU replica's default fill): its masks
    are the CPU's step after step; closed, its segment is unregistered, so the next masker's (often
    mapped at the same address) pins too and masks alike, with no CUDA error left behind."""
    from switchyard.engine.chat.grammar import GrammarMasker
    from switchyard.engine.chat.grammar_process import ProcessMasker
    from switchyard.engine.chat.structured import constraint

    tok, grammars = smollm2_grammars()
    c = constraint({"tool_choice": "required"}, TOOLS)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        proc = ProcessMasker(tok.vocab_size, tok.tok.to_str(), sorted(tok.eos_ids), threads=2, lanes=2, max_rows=8)
        try:
            line = GrammarMasker(tok.vocab_size, ahead=False)
            pairs = [(grammars.compile(c), grammars.compile(c)) for _ in range(5)]
            for _ in range(3):
                x = torch.randn(6, tok.vocab_size, generator=g)
                y = x.to("cuda")
                proc.apply(y, [*(a for a, _ in pairs[:2]), None, *(a for a, _ in pairs[2:])])
                line.apply(x, [*(b for _, b in pairs[:2]), None, *(b for _, b in pairs[2:])])
                proc.wait()
                assert torch.equal(torch.isinf(y.cpu()), torch.isinf(x))
                for (a, b), row in zip(pairs, (0, 1, 3, 4, 5), strict=True):
                    t = int(x[row].argmax())
                    a.accept(t)
                    b.accept(t)
        finally:
            proc.close()
    torch.cuda.synchronize()  # nothing left for a later launch's check to raise


def test_masks_filled_by_a_process_equal_those_filled_in_line() -> None:
    """Filled by a process of their own (chat/grammar_process; the kernel waiting for its ticket,
    interpreted here on CPU logits), rows under two grammars beside a free row get the in-line fill's
    masks step after step; a row whose state is gone frees its mirror and a new row takes a new
    one; a fill that fails and a process that died are EngineFailed on the engine's thread. Four
    constrained rows: the process fills them through llguidance's pool (GrammarMasker.PAR_ROWS)."""
    import gc

    from switchyard.engine.chat.grammar import GrammarMasker
    from switchyard.engine.errors import EngineFailed

    grammars, cs, proc, line = _two_grammars_two_maskers()
    try:
        pairs = [(grammars.compile(cs[k % 2]), grammars.compile(cs[k % 2])) for k in range(GrammarMasker.PAR_ROWS)]
        g = torch.Generator().manual_seed(5)
        for step in range(6):
            if step == 3:  # the first row's request is gone (its state collected), a new one comes
                del pairs[0]
                gc.collect()
                pairs.append((grammars.compile(cs[1]), grammars.compile(cs[1])))
            x = _mask_both(proc, line, [pairs[0], None, *pairs[1:]], g)
            assert torch.isfinite(x[1]).all() and torch.isinf(x[0]).any()
            for (a, b), row in zip(pairs, (0, *range(2, len(pairs) + 1)), strict=True):
                t = int(x[row].argmax())
                a.accept(t)
                b.accept(t)
                assert not a.failed and not b.failed
        assert proc.ticket == 6 and proc._slots == len(pairs) + 1 and not proc._freed  # slot 0's free: step 4's
        bad = grammars.compile(cs[0])
        bad.grammar = "start: nonsense("  # the process cannot compile its mirror: that step's fill fails
        proc.apply(torch.randn(1, proc.vocab_size), [bad])
        with pytest.raises(EngineFailed, match="grammar fill failed"):
            proc.wait()
        proc.proc.kill()
        proc.proc.join()
        proc.ticket += 1  # a step the dead process never fills
        with pytest.raises(EngineFailed, match="process died"):
            proc.wait()
    finally:
        proc.close()


def test_early_tokens_fill_the_next_masks_as_the_in_line_fill_does() -> None:
    """ProcessMasker.early, as the output stage calls it (a step's tokens read, before they are
    accepted): the process's mirrors take them and fill the next step's masks ahead; the masks are the
    in-line fill's step after step while a row finishes (the rows after it move up a place), a row
    takes a reset after its token (a tool-call stream's next call: the ticket refills it) and a new row
    joins (its first mask from the ticket). Five constrained rows: llguidance's pool fills them."""
    grammars, cs, proc, line = _two_grammars_two_maskers()
    try:
        pairs = [(grammars.compile(cs[k % 2]), grammars.compile(cs[k % 2])) for k in range(5)]
        g = torch.Generator().manual_seed(6)
        for step in range(7):
            if step == 2:  # row 1 finished with its last token: rows 2-4 move up a place
                del pairs[1]
            if step == 4:
                pairs.append((grammars.compile(cs[0]), grammars.compile(cs[0])))
            x = _mask_both(proc, line, [pairs[0], None, *pairs[1:]], g)
            rows = (0, *range(2, len(pairs) + 1))
            tokens = [int(x[r].argmax()) if r != 1 else 0 for r in range(len(pairs) + 1)]
            proc.early([pairs[0][0], None, *(a for a, _ in pairs[1:])], tokens)
            assert all(a.sent == 1 for a, _ in pairs)
            for (a, b), row in zip(pairs, rows, strict=True):
                a.accept(tokens[row])
                b.accept(tokens[row])
                assert a.done == b.done and not a.failed and not b.failed  # a's from its mirror's word
            if step == 5:  # row 0 starts over after its token, as EndlessCalls does
                for s in pairs[0]:
                    s.reset()
        assert proc._early == 7
        pickup, consume, gap = proc.last_early_s  # step 6's ticket came after step 5's early fill
        assert 0 < pickup < 1 and 0 < consume < 1 and 0 <= gap < 1
    finally:
        proc.close()


def test_a_mirror_says_whether_an_early_token_ended_the_reply_or_was_refused() -> None:
    """A token that went early is taken by the fill process's mirror, not the engine's matcher: `done`
    reads the mirror's word. A reply the token completes is done, a refused token fails its row, as
    the engine's own matcher says; a row whose next token does not go early is an error, not a
    matcher behind its mirror; a process that dies before it answers, or one closed, is EngineFailed."""
    import llguidance

    from switchyard.engine.chat.grammar import GrammarState
    from switchyard.engine.errors import EngineFailed

    grammars, _, proc, line = _two_grammars_two_maskers()
    lark = 'start: "yes" | "no thanks"'

    def state() -> GrammarState:
        m = llguidance.LLMatcher(grammars.tok, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
        return GrammarState(m, vocab_size=proc.vocab_size, grammar=lark)

    try:
        rows = [(state(), state()) for _ in range(3)]
        g = torch.Generator().manual_seed(7)
        for step in range(8):
            x = _mask_both(proc, line, rows, g)
            tokens = [int(x[r].argmax()) for r in range(len(rows))]
            if step == 0:  # row 2 takes a token its grammar does not allow
                tokens[2] = int(torch.isinf(x[2]).nonzero()[0])
            proc.early([a for a, _ in rows], tokens)
            for (a, b), t in zip(rows, tokens, strict=True):
                a.accept(t)
                b.accept(t)
                assert a.done == b.done and a.failed == b.failed, f"step {step}"
                assert not a.matcher.is_stopped(), "the engine's matcher took none of the early tokens"
            if step == 0:
                assert rows[2][0].failed and rows[2][0].done
            finished = [k for k, (a, _) in enumerate(rows) if a.done]
            rows = [p for k, p in enumerate(rows) if k not in finished]
            if not rows:
                break
        assert not rows and step <= 4, "each reply is a word or two"
        a, no = state(), int(grammars.tok.tokenize_str("n")[0])
        proc.apply(torch.randn(1, proc.vocab_size), [a])
        proc.wait()
        proc.early([a], [no])
        a.accept(no)
        assert not a.done
        proc.apply(torch.randn(1, proc.vocab_size), [a])
        proc.wait()
        with pytest.raises(EngineFailed, match="did not reach its fill process early"):
            a.accept(no)  # its last token went early, this one did not (EARLY switched off within a reply)
        proc.proc.kill()
        proc.proc.join()
        proc.early([a], [no])  # the process is gone: no word comes
        a.accept(no)
        with pytest.raises(EngineFailed, match="process died"):
            assert not a.done
        proc.close()  # its segment unmapped: an error, not a read of unmapped memory
        with pytest.raises(EngineFailed, match="closed"):
            assert not a.done
    finally:
        proc.close()


def test_closing_a_fill_process_ends_it_and_frees_its_segment() -> None:
    """What the engine loop's end (and a bench between decodes) relies on: close() stops the process,
    unlinks its shared memory, and a second close() has nothing left to do."""
    from multiprocessing import shared_memory

    from switchyard.engine.chat.grammar_process import ProcessMasker

    tok, _ = smollm2_grammars()
    proc = ProcessMasker(tok.vocab_size, tok.tok.to_str(), sorted(tok.eos_ids), threads=1, lanes=1, max_rows=2,
                         pinned=False)
    assert proc.proc.is_alive()
    proc.close()
    assert not proc.proc.is_alive() and proc.proc.exitcode == 0  # stopped, not killed
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=proc.shm.name)
    proc.close()


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_fill_process_given_cpus_runs_on_them() -> None:
    """ProcessMasker(cpus=) (the output stage's fill_cpus, Scheduler.pin under --pin-cpus): the process on those
    CPUs alone, its masks still the in-line fill's."""
    import os

    from switchyard.engine.chat.grammar import GrammarMasker
    from switchyard.engine.chat.grammar_process import ProcessMasker
    from switchyard.engine.chat.structured import constraint

    tok, grammars = smollm2_grammars()
    cpus = sorted(os.sched_getaffinity(0))[1:]
    proc = ProcessMasker(tok.vocab_size, tok.tok.to_str(), sorted(tok.eos_ids), threads=1, lanes=1, max_rows=2,
                         pinned=False, cpus=cpus)
    try:
        assert os.sched_getaffinity(proc.proc.pid) == set(cpus)
        c = constraint({"tool_choice": "required"}, TOOLS)
        _mask_both(proc, GrammarMasker(tok.vocab_size, ahead=False), [(grammars.compile(c), grammars.compile(c)), None],
                   torch.Generator().manual_seed(3))
    finally:
        proc.close()
