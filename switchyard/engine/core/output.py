"""The output stage: from a step's logits to what each request's client sees. Grammar masks,
sampling, logprobs, detokenising, stop tokens and stop strings, the length limit, the text
that can no longer change, and the usage of a finished request. The scheduler hands it the
sequences a step advanced; it returns the ones that finished (the scheduler frees them).

It works in two halves, so that the scheduler can overlap the host with the device (async
decode, core/scheduler.py): `sample` queues the device's share (masks, sampling, logprobs) behind
the step that made the logits and starts copying the choices back, without waiting for any of
it; `finish` waits for those values and does the host's share. `advance` is both at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from switchyard.engine.backends.transfer import Download, DownloadPool, upload
from switchyard.engine.chat.grammar import GrammarMasker, fused_mask
from switchyard.engine.chat.tokenizer import ChatTokenizer
from switchyard.engine.core.sampling import row_logprobs, sample_tokens
from switchyard.engine.core.sequence import Event, Sequence
from switchyard.engine.errors import EngineFailed

log = logging.getLogger(__name__)


@dataclass
class Sampled:
    """A step's choices, made where its logits are: `seqs[i]` took `tokens[i]` (a device tensor,
    which async decoding feeds to the next step without reading it), and `host` brings them, with
    the logprobs of the rows in `lp_rows`, back to the host."""

    seqs: list[Sequence]
    tokens: torch.Tensor
    lp_rows: list[int]
    host: Download


class OutputStage:
    REUSE_DOWNLOADS = True  # GPU steps' tokens come down into reused pinned buffers (False, at construction: new ones)
    GPU_ARGMAX = True  # greedy rows of GPU logits by head_kernels.RowArgmax (False, before the first step: torch's)
    FILL_PROCESS: bool | None = None  # masks filled by a process: as grammar_process says (None), or always, or never

    def __init__(self, tokenizer: ChatTokenizer, max_model_len: int, grammar_threads: int = 1,
                 grammar_process: bool = False, max_rows: int = 256) -> None:
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.grammar_threads = grammar_threads  # the masker's fill threads (Grammars' lanes: options.fill_lanes)
        self.grammar_process = grammar_process  # masks filled by a process of their own (--grammar-fill)
        self.max_rows = max_rows  # the most rows a step has (the scheduler's slots)
        self.fill_cpus: list[int] | None = None  # the fill process's CPUs (Scheduler.pin), else any
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0, "requests_finished": 0, "preemptions": 0}
        self.finished_by_reason: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft: list[float] = []
        self.masker: GrammarMasker | None = None  # made on the first constrained step
        self.downloads: DownloadPool | None = None  # made on the first GPU step; finish() reads each in turn
        self.argmax: Callable[[torch.Tensor], torch.Tensor] | None = None  # made on the first GPU step

    def advance(self, seqs: list[Sequence], logits: torch.Tensor) -> list[Sequence]:
        """Sample one token per sequence and stream it; returns the sequences that finished."""
        return self.finish(self.sample(seqs, logits))

    def sample(self, seqs: list[Sequence], logits: torch.Tensor, rows: list[int] | None = None) -> Sampled:
        """The device's share of a step: seqs[i]'s token from logits row rows[i] (rows None: row
        i), under its grammar's mask (filled now, on the host, from the grammar's state after the
        tokens finish() has given it), and the logprobs asked for. Nothing here waits for the
        device."""
        if rows is not None and rows != list(range(logits.shape[0])):
            logits = logits.index_select(0, upload(rows, torch.int64, logits.device))
        grammars = [s.grammar for s in seqs]
        if any(g is not None for g in grammars):
            if self.masker is None:
                width = next(g.vocab_size for g in grammars if g is not None) or logits.shape[1]
                self.masker = self._masker(width, logits.device.type == "cuda")
            self.masker.apply(logits, grammars)
        if self.argmax is None and logits.device.type == "cuda" and self.GPU_ARGMAX:
            from switchyard.engine.backends.cuda.head_kernels import RowArgmax  # triton: only where a GPU is

            self.argmax = RowArgmax()
        tokens = sample_tokens(logits, [s.params for s in seqs], [s.generator for s in seqs], self.argmax)
        lp_rows = [i for i, s in enumerate(seqs) if s.params.logprobs]
        back = [tokens]
        if lp_rows:
            back += row_logprobs(logits, tokens, lp_rows, [seqs[i].params.top_logprobs for i in lp_rows])
        if self.downloads is None and tokens.device.type == "cuda" and self.REUSE_DOWNLOADS:
            self.downloads = DownloadPool()
        return Sampled(list(seqs), tokens, lp_rows, Download(back, self.downloads))

    def _masker(self, width: int, cuda: bool) -> GrammarMasker:
        """A process of its own fills the masks where asked (--grammar-fill, FILL_PROCESS), else a thread."""
        if self._process_wanted():
            from switchyard.engine.chat.grammar_process import ProcessMasker
            from switchyard.engine.runner.options import grammar_lanes

            try:
                return ProcessMasker(width, self.tok.tok.to_str(), sorted(self.tok.eos_ids), self.grammar_threads,
                                     grammar_lanes(self.grammar_threads), self.max_rows, pinned=cuda, cpus=self.fill_cpus)
            except EngineFailed as e:
                log.warning("grammar masks filled on a thread: %s", e)
        return GrammarMasker(width, threads=self.grammar_threads)

    def close(self) -> None:
        """Free the masker's process and shared memory (chat/grammar_process), if it has them; at the end
        of the engine's loop, so a failure here is logged rather than raised over the loop's own."""
        if self.masker is not None:
            try:
                self.masker.close()
            except Exception as e:  # a GPU already failed
                log.warning("the grammar masker did not close: %s: %s", type(e).__name__, e)

    @property
    def fill(self) -> str:
        """Where the grammar masks fill: the masker's WHERE once a constrained step made it, else
        where it will try to."""
        if self.masker is not None:
            return self.masker.WHERE
        return "process" if self._process_wanted() else "thread"

    def _process_wanted(self) -> bool:
        """--grammar-fill's process (or FILL_PROCESS's), where triton's kernel is: its masking waits on it."""
        wanted = self.grammar_process if self.FILL_PROCESS is None else self.FILL_PROCESS
        return wanted and fused_mask() is not None

    def finish(self, sampled: Sampled) -> list[Sequence]:
        """The host's share: wait for the step's tokens, then stream them; returns the sequences
        that finished. A sequence that finished (an abort) since the step was sampled is skipped:
        its token is dropped."""
        host = sampled.host.get()
        tokens = host[0].tolist()
        if self.masker is not None:
            self.masker.wait()  # the fill thread's matchers (masks filled ahead) are ours again
            if self.masker.EARLY:  # a fill process's (unless a bench turned it off)
                self.masker.early([None if s.finished else s.grammar for s in sampled.seqs], tokens)
        lps: dict[int, tuple[float, list[float], list[int]]] = {}
        if sampled.lp_rows:
            chosen, vals, ids = (t.tolist() for t in host[1:])
            lps = {i: (chosen[k], vals[k], ids[k]) for k, i in enumerate(sampled.lp_rows)}
        now = time.monotonic()
        done: list[Sequence] = []
        for i, (s, tok) in enumerate(zip(sampled.seqs, tokens, strict=True)):
            if s.finished:
                continue
            if s.first_token_at is None:
                s.first_token_at = now
                self.ttft.append(now - s.arrived)
            p = s.params
            stop_tok = not p.ignore_eos and (tok in self.tok.eos_ids or tok in p.stop_token_ids)
            if s.grammar is not None:
                s.grammar.accept(tok)
            if not stop_tok:
                s.out.append(tok)
                self.stats["generation_tokens"] += 1
            if p.logprobs and not stop_tok:
                lp, top_vals, top_ids = lps[i]
                n = p.top_logprobs
                s.pending_logprobs.append({"id": tok, "logprob": lp,
                                           "top": list(zip(top_ids[:n], top_vals[:n], strict=True))})
            reason = "stop" if stop_tok else self._reason(s, tok)
            self._emit(s, final=reason is not None)
            if reason is not None:
                s.finished = True
                done.append(s)
                self.stats["requests_finished"] += 1
                self.finished_by_reason[reason] += 1
                s.sink({"type": "finish", "reason": reason, "usage": usage(s)})
        return done

    def _reason(self, s: Sequence, tok: int) -> str | None:
        """Why s stops after taking tok (not a stop token), or None."""
        assert s.detok is not None
        s.detok.push(tok)
        if s.params.stop and hit_stop(s):
            return "stop"
        if s.grammar is not None and s.grammar.done:
            return "stop"  # the structure is complete: nothing but EOS could follow
        if len(s.out) >= s.params.max_tokens or s.ctx_len >= self.max_model_len:
            return "length"
        return None

    def _emit(self, s: Sequence, final: bool) -> None:
        """Send text that can no longer change: hold back what might start a stop string."""
        assert s.detok is not None
        text = s.detok.text
        limit = len(text)
        if not final and s.params.stop:
            limit -= max(len(x) for x in s.params.stop) - 1
            if text.endswith("\ufffd"):
                limit = min(limit, len(text) - 1)
        if limit > s.emitted or (s.pending_logprobs and final):
            delta = text[s.emitted:limit] if limit > s.emitted else ""
            s.emitted = max(s.emitted, limit)
            ev: Event = {"type": "delta", "text": delta}
            if s.pending_logprobs:
                ev["logprobs"] = s.pending_logprobs
                s.pending_logprobs = []
            s.sink(ev)


def hit_stop(s: Sequence) -> bool:
    """Whether s's text now holds one of its stop strings; if so the text is cut before it."""
    assert s.detok is not None
    text = s.detok.text
    window = max(len(x) for x in s.params.stop) + 16
    start = max(0, s.emitted - window)
    best = -1
    for x in s.params.stop:
        j = text.find(x, start)
        if j >= 0 and (best < 0 or j < best):
            best = j
    if best < 0:
        return False
    s.detok.text = text[:best]
    return True


def usage(s: Sequence) -> dict[str, object]:
    """OpenAI's usage object of a finished request."""
    return {"prompt_tokens": len(s.prompt), "completion_tokens": len(s.out),
            "total_tokens": len(s.prompt) + len(s.out), "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}
