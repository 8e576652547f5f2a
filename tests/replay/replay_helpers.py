"""Helpers for the replay tests: answers for the test upstream, a two-pool policy."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
from replay_upstream import messages_key

from switchyard.replay.cases import Case
from switchyard.replay.scoring import ground_truth_calls


def write_answers(cases: list[Case], path: Path) -> Path:
    """The ground-truth answer of every case, keyed as the upstream server looks it up,
    with the tool names the model sees (legal OpenAI names)."""
    answers = {}
    for c in cases:
        legal = {orig: legal for legal, orig in c.name_map.items()}
        answers[messages_key(c.body["messages"])] = [
            {"name": legal.get(name, name), "arguments": args}
            for call in ground_truth_calls(c)
            for name, args in call.items()
        ]
    path.write_text(json.dumps(answers), encoding="utf-8")
    return path


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0, trust_env=False)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not up within {timeout}s")


def policy_file(path: Path, small_url: str, large_url: str, extra: str = "") -> Path:
    path.write_text(
        f"""version: 1
pools:
  small:
    model: small-model
    retries: 0
    replicas: [{{url: "{small_url}"}}]
  large:
    model: large-model
    retries: 0
    replicas: [{{url: "{large_url}"}}]
{extra}routes:
  - name: several-tools
    when: {{tools: ">= 2"}}
    pool: large
  - name: default
    pool: small
""",
        encoding="utf-8",
    )
    return path
