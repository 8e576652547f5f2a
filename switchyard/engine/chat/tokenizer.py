"""Tokenizer and chat template from a GGUF file (or an HF directory's tokenizer.json)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from switchyard.engine.chat.tools import render_tool_messages
from switchyard.engine.model.gguf_file import GGUFFile

# ChatML, for models whose file carries no template.
_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Pre-tokenizer splits, as llama.cpp picks them from `tokenizer.ggml.pre` (src/llama-vocab.cpp):
# each regex splits the pieces the one before it left, matches and the text between them alike.
# The case-insensitive contractions `(?i:'s|...)` of the models' own tokenizer.json are spelled
# out, as llama.cpp does.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "dbrx": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "chatglm-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "stablelm2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "gpt-2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    "deepseek-llm": (
        r"[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+",
    ),
}
# Other names llama.cpp gives the same splits.
_SPLIT_ALIASES = {
    "llama-bpe": "llama3", "llama-v3": "llama3", "falcon3": "llama3", "falcon-h1": "llama3", "pixtral": "llama3",
    "lfm2": "llama3", "midm-2.0": "llama3",
    "deepseek-r1-qwen": "qwen2", "kormo": "qwen2", "hunyuan": "qwen2",
    "phi-2": "gpt-2", "mpt": "gpt-2", "olmo": "gpt-2", "jais": "gpt-2", "trillion": "gpt-2", "gigachat": "gpt-2",
    "mellum": "gpt-2", "a.x-4.0": "gpt-2",
    "refact": "starcoder", "command-r": "starcoder", "smollm": "starcoder", "codeshell": "starcoder",
    "exaone": "starcoder", "minerva-7b": "starcoder",
}
# Pre-tokenizers under which a whole piece that is itself a token is taken as it is, merges or
# not (llama.cpp's `ignore_merges`, the models' own tokenizer.json too).
_IGNORE_MERGES = {"llama3", "qwen35"}
# tokenizer.ggml.token_type values
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


class ChatTokenizer:
    def __init__(self, tok: Tokenizer, template: str | None, bos: str | None, eos_ids: set[int],
                 add_bos: bool = False) -> None:
        import jinja2
        import jinja2.sandbox

        self.tok = tok
        self.template_src = template or _CHATML
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
        self.template = env.from_string(self.template_src)
        self.template_knows_tools = "tools" in self.template_src
        self.bos = bos
        self.add_bos = add_bos
        self.eos_ids = eos_ids
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of text; add_special: the BOS token first where the model wants one."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos is not None:
            bos_id = self.tok.token_to_id(self.bos)
            if bos_id is not None and (not ids or ids[0] != bos_id):
                ids = [bos_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def id_to_token(self, i: int) -> str:
        return self.decode([i])

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> str:
        msgs = render_tool_messages(messages, None if self.template_knows_tools else tools)
        kwargs: dict[str, Any] = {"messages": msgs, "add_generation_prompt": add_generation_prompt,
                                  "bos_token": self.bos or "", "eos_token": ""}
        if tools and self.template_knows_tools:
            kwargs["tools"] = tools
        return self.template.render(**kwargs)


def _raise(msg: str) -> None:
    raise ValueError(msg)


def from_gguf(reader: GGUFFile) -> ChatTokenizer:
    """The tokenizer a GGUF file describes, splitting text as llama.cpp does: byte-level BPE
    (`tokenizer.ggml.model = gpt2`) with the pre-tokenizer `tokenizer.ggml.pre` names, or
    SentencePiece (`llama`: Llama 2, Phi-3) from the tokens' scores."""
    get = reader.fields.get

    kind = get("tokenizer.ggml.model")
    tokens: list[str] = get("tokenizer.ggml.tokens")
    types: list[int] = get("tokenizer.ggml.token_type", [_NORMAL] * len(tokens))
    if kind == "gpt2":
        tok = _byte_level_bpe(tokens, get("tokenizer.ggml.merges", []), get("tokenizer.ggml.pre") or "default")
    elif kind == "llama":
        tok = _sentencepiece(tokens, get("tokenizer.ggml.scores"), types,
                             bool(get("tokenizer.ggml.add_space_prefix", True)))
    else:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (gpt2 BPE and llama SentencePiece are)")
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=False)
                if ty in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens(specials)
    vocab = {t: i for i, t in enumerate(tokens)}
    bos_id = get("tokenizer.ggml.bos_token_id")
    eos_id = get("tokenizer.ggml.eos_token_id")
    eos_ids = {int(eos_id)} if eos_id is not None else set()
    eos_ids.update(vocab[t] for t in ("<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<|end|>") if t in vocab)
    return ChatTokenizer(tok, get("tokenizer.chat_template"), tokens[bos_id] if bos_id is not None else None,
                         eos_ids, add_bos=bool(get("tokenizer.ggml.add_bos_token", kind == "llama")))


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    name = _SPLIT_ALIASES.get(pre, pre)
    if name not in _SPLITS:
        known = sorted({*_SPLITS, *_SPLIT_ALIASES})
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(known)})")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                               ignore_merges=name in _IGNORE_MERGES))
    splits: list[Any] = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLITS[name]]
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(tokens: list[str], scores: list[float] | None, types: list[int], add_space_prefix: bool) -> Tokenizer:
    """SentencePiece BPE as merges: a pair of pieces merges into the piece they spell, the
    piece with the higher score first (llama.cpp's SPM tokenizer merges the same way); text
    no piece covers falls back to its UTF-8 bytes (<0xNN> tokens)."""
    if scores is None:
        raise ValueError("GGUF SentencePiece tokenizer without tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t for t, ty in zip(tokens, types, strict=False) if ty in (_NORMAL, _USER_DEFINED)}
    merges = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                merges.append((scores[vocab[piece]], vocab[piece], vocab[left], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    unk = next((t for t, ty in zip(tokens, types, strict=False) if ty == _UNKNOWN), None)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], unk_token=unk, fuse_unk=True,
                               byte_fallback=True))
    steps: list[Any] = [normalizers.Prepend("\u2581")] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     *([decoders.Strip(" ", 1, 0)] if add_space_prefix else [])])
    return tok


def from_hf_dir(directory: Path, eos_ids: set[int]) -> ChatTokenizer:
    d = Path(directory)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    template = cfg.get("chat_template")
    jt = d / "chat_template.jinja"
    if template is None and jt.exists():
        template = jt.read_text()
    bos = cfg.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    eos = cfg.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    ids = set(eos_ids)
    if eos and tok.token_to_id(eos) is not None:
        ids.add(tok.token_to_id(eos))
    return ChatTokenizer(tok, template, bos, ids, add_bos=bool(cfg.get("add_bos_token", False)))


class Detokenizer:
    """Incremental detokenization: emits only text that later tokens cannot change.

    Each token decodes a short window (from a few tokens back), as vLLM does, not the whole
    output: decoding it all each step made a 2,000-token reply cost O(n^2). The window starts
    at an earlier token so both decodes see the same leading context (SentencePiece-style
    decoders drop a leading space at the start of a decode)."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.t = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix = 0  # the window's first token
        self.read = 0  # tokens already turned into text

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.t.decode(self.ids[self.prefix:self.read])
        now = self.t.decode(self.ids[self.prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):  # e.g. an incomplete UTF-8 sequence
            return ""
        delta = now[len(before):]
        self.text += delta
        self.prefix, self.read = self.read, len(self.ids)
        return delta
