"""The output stage: from a step's logits to what each request's client sees. Grammar masks,
sampling, logprobs, detokenising, stop tokens and stop strings, the length limit, the text
that can no longer change, and the usage of a finished request. The scheduler hands it the
sequences a step advanced; it returns the ones that finished (the scheduler frees them)."""

from __future__ import annotations

import time

import torch

from switchyard.engine.chat.grammar import GrammarMasker
from switchyard.engine.chat.tokenizer import ChatTokenizer
from switchyard.engine.core.sampling import sample, token_logprobs
from switchyard.engine.core.sequence import Event, Sequence


class OutputStage:
    def __init__(self, tokenizer: ChatTokenizer, max_model_len: int) -> None:
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0, "requests_finished": 0, "preemptions": 0}
        self.finished_by_reason: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft: list[float] = []
        self.masker: GrammarMasker | None = None  # made on the first constrained step

    def advance(self, seqs: list[Sequence], logits: torch.Tensor) -> list[Sequence]:
        """Sample one token per sequence and stream it; returns the sequences that finished."""
        grammars = [s.grammar for s in seqs]
        if any(g is not None for g in grammars):
            if self.masker is None:
                self.masker = GrammarMasker(logits.shape[1])
            self.masker.apply(logits, grammars)
        tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        now = time.monotonic()
        done: list[Sequence] = []
        for i, (s, tok) in enumerate(zip(seqs, tokens, strict=True)):
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
            if p.logprobs:
                lp, top = token_logprobs(logits[i], tok, p.top_logprobs)
                if not stop_tok:
                    s.pending_logprobs.append({"id": tok, "logprob": lp, "top": top})
            reason = "stop" if stop_tok else self._reason(s, tok)
            self._emit(s, final=reason is not None)
            if reason is not None:
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
