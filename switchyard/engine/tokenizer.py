"""Tokenizer and chat template from a GGUF file (or an HF directory's tokenizer.json)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from switchyard.engine.tools import render_tool_messages

# ChatML, for models whose file carries no template.
_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


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

    def encode(self, text: str) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos is not None:
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


def from_gguf(reader: Any) -> ChatTokenizer:
    f = reader.fields

    def get(key: str, default: Any = None) -> Any:
        return f[key].contents() if key in f else default

    kind = get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (gpt2-style BPE is)")
    tokens: list[str] = get("tokenizer.ggml.tokens")
    types: list[int] = get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = get("tokenizer.ggml.pre", "default")
    splits: list[Any] = []
    if pre in ("smollm", "starcoder", "refact", "deepseek-coder"):
        splits.append(pre_tokenizers.Digits(individual_digits=True))
    splits.append(pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated"))
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=False)
                if ty in (3, 4)]
    tok.add_special_tokens(specials)
    bos_id = get("tokenizer.ggml.bos_token_id")
    eos_id = get("tokenizer.ggml.eos_token_id")
    eos_ids = {int(eos_id)} if eos_id is not None else set()
    eot = vocab.get("<|endoftext|>")
    if eot is not None:
        eos_ids.add(eot)
    eos_ids.update(vocab[t] for t in ("<|eot_id|>", "<|im_end|>") if t in vocab)
    return ChatTokenizer(tok, get("tokenizer.chat_template"), tokens[bos_id] if bos_id is not None else None,
                         eos_ids, add_bos=bool(get("tokenizer.ggml.add_bos_token", False)))


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
