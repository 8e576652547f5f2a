"""The policy file's schema: what a user may write in a policy YAML, validated by pydantic.

Everything here is plain data. Rules are compiled into predicates by `policy.rules`;
pools are turned into live replica sets by `pools`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """'200ms', '30s', '1h', 5 (seconds) -> seconds as a float."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s or 1h, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNIT[m.group(2)]
    raise ValueError(f"expected a duration like 200ms, 30s, 5m or 1h, got {value!r}")


class _Strict(BaseModel):
    # Unknown keys are typos far more often than intent: reject them with their name.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaSpec(_Strict):
    url: str = Field(description="Base URL of an OpenAI-compatible server, ending in /v1")
    name: str | None = Field(None, description="Label in headers and metrics (default: host:port)")
    weight: int = Field(1, ge=1, description="Relative share for round_robin")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"replica url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")


class EngineLaunch(_Strict):
    """How this pool's replicas are launched: by `switchyard up` (our engine) and `switchyard plan --emit`."""

    runtime: Literal["switchyard", "vllm", "sglang", "llama.cpp"] = Field(
        "switchyard", description="Inference server: our engine, vLLM, SGLang or llama.cpp's llama-server")
    model: str = Field(description="switchyard: a `switchyard models pull` name or a file path; vllm, sglang: "
                                   "a Hugging Face id or a path; llama.cpp: a GGUF path or a Hugging Face repo[:quant]")
    image: str | None = Field(None, description="Container image in compose and Kubernetes files "
                                                "(default: the runtime's official image)")
    tp: int = Field(1, ge=1, description="Tensor-parallel ranks per replica (vllm: with pipeline parallel "
                                         "over the rest of the replica's ranks)")
    collective: Literal["ring", "oneshot", "auto"] = Field("auto", description="switchyard only: all-reduce backend")
    device: Literal["cpu", "cuda"] = "cpu"
    args: list[str] = Field(default_factory=list, description="Extra arguments for the runtime's server")


class CircuitSpec(_Strict):
    failures: int = Field(3, ge=1, description="Consecutive failures that open the breaker")
    cooldown: float = Field(10.0, description="Seconds the breaker stays open before one trial")

    _dur = field_validator("cooldown", mode="before")(lambda v: parse_duration(v))


class HealthSpec(_Strict):
    interval: float = Field(5.0, description="Seconds between active health checks (0: off)")
    timeout: float = Field(2.0, description="Seconds before a health check counts as failed")
    path: str | None = Field(None, description="Health path on the server root (default /health, else /v1/models)")

    _dur = field_validator("interval", "timeout", mode="before")(lambda v: parse_duration(v))


class PriceSpec(_Strict):
    """What a pool's tokens cost, in USD per million tokens (as providers list them)."""

    prompt: float = Field(ge=0, description="USD per million prompt (input) tokens")
    completion: float = Field(ge=0, description="USD per million completion (output) tokens")
    cached: float | None = Field(None, ge=0, description="USD per million cached prompt tokens "
                                                         "(usage.prompt_tokens_details.cached_tokens; default: "
                                                         "the prompt price)")

    def cost(self, prompt: int, completion: int, cached: int = 0) -> float:
        """USD for one answer's usage. `prompt` counts the cached tokens too, as OpenAI's usage does."""
        cached = min(max(cached, 0), prompt)
        cached_price = self.prompt if self.cached is None else self.cached
        return ((prompt - cached) * self.prompt + cached * cached_price + completion * self.completion) / 1e6


class LoadSpec(_Strict):
    """strategy least_load: how the replicas' own metrics are read."""

    interval: float = Field(1.0, gt=0, description="Seconds between two reads of a replica's metrics "
                                                   "(shared by the gateways of one Redis)")
    timeout: float = Field(0.5, gt=0, description="Seconds before a read of the metrics counts as failed")
    stale: float = Field(5.0, gt=0, description="Metrics older than this are ignored: the gateway's "
                                                "in-flight count decides alone")
    path: str = Field("/metrics", description="Prometheus metrics path on the server root (vLLM, SGLang "
                                              "and our engine serve /metrics)")

    _dur = field_validator("interval", "timeout", "stale", mode="before")(lambda v: parse_duration(v))


class PoolSpec(_Strict):
    model: str = Field(description="Model name sent upstream (the request's `model` is rewritten to it)")
    strategy: Literal["least_inflight", "power_of_two", "round_robin", "cache_aware", "least_load"] = Field(
        "least_inflight", description="cache_aware: a request's prefix (system, tools, first user message) "
        "picks its replica on a consistent-hash ring with bounded loads (KV-cache reuse across turns); "
        "least_load: the replicas' own running/waiting requests and KV-cache usage from their /metrics "
        "(vLLM, SGLang, llama.cpp, our engine) combined with the gateway's in-flight counts")
    max_inflight_per_replica: int = Field(32, ge=1)
    queue_size: int = Field(64, ge=0, description="Requests that may wait for a free slot")
    queue_timeout: float = Field(5.0, description="How long a request waits for a slot before fallback/429")
    timeout: float = Field(600.0, description="Seconds for a whole upstream request")
    connect_timeout: float = Field(2.0)
    retries: int = Field(2, ge=0, description="Extra attempts on other replicas before the first byte")
    replicas: list[ReplicaSpec] | int = Field(
        description="Replica URLs; or, in a planning policy, how many replicas to place"
    )
    label: str | None = Field(None, description="Classifier label this pool serves (for on_failure)")
    api_key: str | None = Field(None, description="Bearer key sent upstream; '${ENV}' reads a variable")
    circuit: CircuitSpec = Field(default_factory=CircuitSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    engine: EngineLaunch | None = Field(None, description="How `switchyard up` launches the replicas")
    price: PriceSpec | None = Field(None, description="USD per million tokens: switchyard_cost_usd_total, "
                                                      "x-switchyard-cost-usd, the dashboard's and replay's savings")
    stream_usage: bool = Field(True, description="Ask the upstream for usage in streams (stream_options."
                                                 "include_usage) when the client did not; the extra chunk is "
                                                 "not passed on. Off for a server that refuses stream_options")
    load: LoadSpec = Field(default_factory=LoadSpec, description="strategy least_load: reading replica metrics")
    max_model_len: int | None = Field(
        None, ge=1, description="Context window of the replicas, in tokens (default: what their /v1/models or "
        "/props reports: vLLM, SGLang, llama-server, our engine). A request that cannot fit is not sent here; "
        "max_tokens beyond what the window leaves is lowered to fit")
    api: list[Literal["chat", "responses", "messages"]] = Field(
        default_factory=lambda: ["chat"], description="Client APIs the replicas serve themselves: a Responses "
        "or Messages request goes to them untranslated (vLLM, SGLang, llama-server serve all three); other "
        "pools get it translated to Chat Completions")
    # Planning (switchyard plan): what a replica needs and what it delivers.
    nodes_per_replica: int = Field(1, ge=1, description="Nodes one replica spans (its TP width across nodes)")
    ranks_per_node: int = Field(1, ge=1, description="GPUs (ranks) per node")
    rate: float | None = Field(None, gt=0, description="Throughput of one replica (req/s or tok/s)")
    model_size_gb: float | None = Field(None, gt=0, description="Weight bytes of the whole model, GB")
    model_file: str | None = Field(None, description="Model file to size the weights from")
    kv_cache_gb: float = Field(0.0, ge=0, description="KV cache reserved per node, GB")

    _dur = field_validator("queue_timeout", "timeout", "connect_timeout", mode="before")(
        lambda v: parse_duration(v)
    )

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: list[ReplicaSpec] | int) -> list[ReplicaSpec] | int:
        if isinstance(v, int) and v < 1:
            raise ValueError("a pool needs at least one replica")
        if isinstance(v, list):
            if not v:
                raise ValueError("a pool needs at least one replica")
            urls = [r.url for r in v]
            dup = {u for u in urls if urls.count(u) > 1}
            if dup:
                raise ValueError(f"replica listed twice: {sorted(dup)[0]}")
        return v

    @property
    def replica_count(self) -> int:
        return self.replicas if isinstance(self.replicas, int) else len(self.replicas)


class ClassifierSpec(_Strict):
    kind: Literal["onnx", "llm", "none"] = "none"
    path: str | None = Field(None, description="onnx: model file (relative to the policy file)")
    pool: str | None = Field(None, description="llm: the pool whose model labels requests")
    labels: list[str] = Field(default_factory=lambda: ["simple", "complex"])
    classify_on: Literal["every_request", "user_turn", "new_session"] = "every_request"
    escalate_only: bool = Field(False, description="Within a session: small -> large, never back")
    timeout: float = Field(0.2, description="llm: time budget; past it the label is on_failure")
    on_failure: str | None = Field(None, description="Label used when the classifier fails (default: last label)")
    prompt: str | None = Field(None, description="llm: instruction; {labels} is replaced by the label list")

    _dur = field_validator("timeout", mode="before")(lambda v: parse_duration(v))

    @model_validator(mode="after")
    def _needs(self) -> ClassifierSpec:
        if self.kind == "onnx" and not self.path:
            raise ValueError("classifier kind onnx needs `path` (the .onnx file)")
        if self.kind == "llm" and not self.pool:
            raise ValueError("classifier kind llm needs `pool` (whose model labels requests)")
        if len(self.labels) < 2:
            raise ValueError("a classifier needs at least two labels")
        if self.on_failure is not None and self.on_failure not in self.labels:
            raise ValueError(f"on_failure {self.on_failure!r} is not one of the labels {self.labels}")
        return self

    @property
    def failure_label(self) -> str:
        return self.on_failure or self.labels[-1]


class SessionSpec(_Strict):
    pin: Literal["none", "pool", "replica"] = "none"
    ttl: float = Field(3600.0, description="How long a session's decision is kept after its last request")

    _dur = field_validator("ttl", mode="before")(lambda v: parse_duration(v))


class RouteSpec(_Strict):
    name: str = Field(description="Shown in x-switchyard-rule and metrics")
    when: dict[str, Any] = Field(
        default_factory=dict,
        description="Predicates, all must hold: label, confidence, tools, turns, prompt_tokens, "
        "model, tool_result, tool_error, tool_choice (auto|none|required|named), response_format "
        "(text|json_object|json_schema), header.NAME, text (regex). Empty: always matches.",
    )
    pool: str | dict[str, int] = Field(description="A pool, or a weighted split {pool: weight}")

    @field_validator("pool")
    @classmethod
    def _split(cls, v: str | dict[str, int]) -> str | dict[str, int]:
        if isinstance(v, dict):
            if not v:
                raise ValueError("a split needs at least one pool")
            for name, w in v.items():
                if not isinstance(w, int) or isinstance(w, bool) or w < 0:
                    raise ValueError(f"split weight for {name!r} must be a whole number >= 0")
            if sum(v.values()) <= 0:
                raise ValueError("split weights must add up to more than 0")
        return v

    @property
    def pools(self) -> list[str]:
        return [self.pool] if isinstance(self.pool, str) else list(self.pool)


class PolicySpec(_Strict):
    version: Literal[1] = 1
    name: str | None = Field(None, description="Virtual model name (default: the file's stem)")
    description: str | None = None
    pools: dict[str, PoolSpec]
    classifier: ClassifierSpec = Field(default_factory=ClassifierSpec)
    session: SessionSpec = Field(default_factory=SessionSpec)
    routes: list[RouteSpec] = Field(min_length=1)
    fallback: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("pools")
    @classmethod
    def _some_pools(cls, v: dict[str, PoolSpec]) -> dict[str, PoolSpec]:
        if not v:
            raise ValueError("a policy needs at least one pool")
        return v


def baseline_pool(spec: PolicySpec) -> str | None:
    """The pool that "large-only" means when costs are compared (the dashboard's savings line): the
    pool named `large` when it has a price, else the priced pool with the highest price."""
    priced = {n: p.price for n, p in spec.pools.items() if p.price is not None}
    if not priced:
        return None
    if "large" in priced:
        return "large"
    return max(priced, key=lambda n: (priced[n].prompt + priced[n].completion, n))  # type: ignore[union-attr]


def reference_problems(spec: PolicySpec) -> list[tuple[tuple, str]]:
    """Names that point nowhere: (location in the document, reason). Checked after the schema,
    outside pydantic, so that each problem keeps the line of the key it is about."""
    out: list[tuple[tuple, str]] = []
    names = set(spec.pools)
    seen: set[str] = set()
    for i, r in enumerate(spec.routes):
        if r.name in seen:
            out.append((("routes", i, "name"), f"routes[{i}]: rule name {r.name!r} used twice"))
        seen.add(r.name)
        for p in r.pools:
            if p not in names:
                out.append(
                    (("routes", i, "pool"), f"routes[{i}] ({r.name}): unknown pool {p!r}; pools are {sorted(names)}")
                )
    for src, chain in spec.fallback.items():
        if src not in names:
            out.append((("fallback", src), f"fallback: unknown pool {src!r}"))
        for p in chain:
            if p not in names:
                out.append((("fallback", src), f"fallback.{src}: unknown pool {p!r}"))
            elif p == src:
                out.append((("fallback", src), f"fallback.{src}: a pool cannot fall back to itself"))
    if spec.classifier.kind == "llm" and spec.classifier.pool not in names:
        out.append((("classifier", "pool"), f"classifier.pool: unknown pool {spec.classifier.pool!r}"))
    return out
