"""Our llguidance slices (chat/grammar.SLICES, character classes of common string patterns) change how a
mask is computed, never its bits: the same random walks under llguidance's general slices and ours give
the same masks, step after step, on SmolLM2's real tokenizer."""

from __future__ import annotations

import random

import llguidance
import numpy as np
from engine_support import TOOLS, smollm2_grammars

# Strings under patterns of each class SLICES names, lengths bounded below and above, and free strings.
PATTERNED = {"type": "object", "required": ["name", "code", "tags", "zip", "note"], "properties": {
    "name": {"type": "string", "pattern": "^[a-z ]{4,24}$"},
    "code": {"type": "string", "pattern": "^[A-Za-z0-9_]{3,10}$"},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,12}$"}, "maxItems": 3},
    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    "note": {"type": "string", "maxLength": 40}}}


def test_our_slices_give_the_general_slices_masks() -> None:
    from switchyard.engine.chat.grammar import SLICES, ll_tokenizer
    from switchyard.engine.chat.structured import constraint

    tok, _ = smollm2_grammars()
    vocab, words = tok.vocab_size, (tok.vocab_size + 31) // 32
    general = llguidance.LLTokenizer.general_slices()
    assert set(general) < set(SLICES)
    toks = [ll_tokenizer(tok.tok.to_str(), vocab, sorted(tok.eos_ids), s) for s in (general, None)]
    schema = {"type": "json_schema", "json_schema": {"name": "patterned", "schema": PATTERNED}}
    for body, tools in (({"response_format": schema}, None), ({"tool_choice": "required"}, TOOLS)):
        c = constraint(body, tools)
        assert c is not None
        rng = random.Random(0)
        for _ in range(3):  # walks: each step a token drawn from the allowed ones, as random weights pick
            ms = [llguidance.LLMatcher(t, llguidance.LLMatcher.grammar_from_lark(c.grammar), log_level=0)
                  for t in toks]
            bms = [np.zeros(words, dtype=np.int32) for _ in ms]
            steps = 0
            while not ms[0].is_stopped() and steps < 150:
                for m, bm in zip(ms, bms, strict=True):
                    m.unsafe_compute_mask_ptr(bm.ctypes.data, words * 4)
                assert np.array_equal(bms[0], bms[1]), f"step {steps}: the slices changed a mask"
                allowed = np.flatnonzero(np.unpackbits(bms[1].view(np.uint8), bitorder="little")[:vocab])
                x = int(allowed[rng.randrange(len(allowed))])
                assert all(m.consume_token(x) for m in ms)
                steps += 1
            assert steps > 20
