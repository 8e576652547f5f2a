"""The real agent CLIs against the gateway (issue 27): Codex CLI (OpenAI Responses) and Claude Code
(Anthropic Messages), from npm, each asked a question through `switchyard up` (our engine serving
SmolLM2 at its own 8,192-token window, TP=1, and the gateway in front), in print mode with a
throwaway HOME. `make agents-check` installs both into ~/.cache/switchyard/agents and runs this
module; without them it skips, saying so.

Claude Code's default request (24 tools, ~76 KB, ~20k SmolLM2 tokens with version 2.1.197) cannot
fit SmolLM2's window: it must get Anthropic's "prompt is too long" at once, and the CLI must print
it. Trimmed (`--system-prompt ... --tools ""`) it answers. Codex's default instructions are trimmed
with `model_instructions_file` (its tools alone are ~19 KB).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from procs import ROOT, free_port, http_get

# A test's time counts its module's start-up (an engine and a gateway, ~2 min on a busy 2-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

AGENTS_DIR = Path(os.environ.get("SWITCHYARD_AGENTS_DIR", Path.home() / ".cache" / "switchyard" / "agents"))
QUESTION = "What is the capital of France? Answer in one word."
CLI_TIMEOUT = 420.0  # a ~6k-token prefill and an answer on a shared 2-core CPU

POLICY = """
version: 1
name: agents
pools:
  small:
    model: smollm2-135m
    timeout: 400s
    health: {{interval: 1s, timeout: 2s}}
    replicas: [{{url: "http://127.0.0.1:{port}/v1", name: small-0}}]
    engine:
      model: smollm2-135m
      tp: 1
      # The model's own window (8,192); KV blocks for two full windows keep the test's memory small.
      args: ["--max-num-seqs", "2", "--max-model-len", "8192", "--num-kv-blocks", "1024"]
routes:
  - name: default
    pool: small
"""


def _cli(name: str) -> Path | None:
    local = AGENTS_DIR / "node_modules" / ".bin" / name
    if local.exists():
        return local
    found = shutil.which(name)
    return Path(found) if found else None


def _need(name: str, package: str) -> Path:
    path = _cli(name)
    if path is None:
        pytest.skip(f"{name} ({package}) is not installed: `make agents-check` installs it into {AGENTS_DIR}")
    return path


@dataclass
class Up:
    url: str  # the gateway's root
    tmp: Path

    def home(self, name: str) -> Path:
        """A throwaway HOME: nothing of the user's own CLI settings, logins or history."""
        home = self.tmp / f"home-{name}-{time.monotonic_ns()}"
        home.mkdir()
        return home


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    if _cli("codex") is None and _cli("claude") is None:
        pytest.skip(f"neither codex nor claude is installed: `make agents-check` installs them into {AGENTS_DIR}")
    tmp = tmp_path_factory.mktemp("agents")
    engine, gw = free_port(), free_port()
    policy = tmp / "agents.yaml"
    policy.write_text(POLICY.format(port=engine))
    out = tmp / "up.out"
    log = out.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "up", "--policy", str(policy), "--port",
                             str(gw), "--log-dir", str(tmp / "logs")], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{gw}"
    try:
        deadline = time.monotonic() + 300
        while "Switchyard is up" not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        # The gateway reads the engine's window when its health check finds it up.
        while "max_model_len" not in http_get(url + "/health")[1].decode():
            assert time.monotonic() < deadline, http_get(url + "/health")[1].decode()
            time.sleep(0.2)
        assert '"smollm2-135m":8192' in http_get(url + "/health")[1].decode().replace(" ", "")
        yield Up(url, tmp)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _run(cmd: list[str], home: Path, env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR")}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env={**base, "HOME": str(home), **env}, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL)
    return done, time.perf_counter() - t0


def _claude(up: Up, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    claude = _need("claude", "@anthropic-ai/claude-code")
    home = up.home("claude")
    env = {"ANTHROPIC_BASE_URL": up.url, "ANTHROPIC_API_KEY": "anything",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", **(env or {})}
    return _run([str(claude), "-p", QUESTION, "--model", "auto", "--max-turns", "1", *args], home, env, home)


def test_claude_code_answers_when_trimmed_to_fit(up: Up) -> None:
    # Its max_tokens (32000, lowered by the gateway to what the window leaves) capped by the CLI's own
    # setting, so that a 135M model that rambles cannot hold the CPU for minutes.
    done, _ = _claude(up, "--system-prompt", "Answer briefly.", "--tools", "", env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"})
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    answer = done.stdout.strip()
    assert answer, f"no answer; stderr:\n{done.stderr}"
    assert "issue with the selected model" not in answer and "API Error" not in answer, answer


def test_claude_code_default_request_is_too_long_and_says_so_fast(up: Up) -> None:
    done, took = _claude(up)
    said = done.stdout + done.stderr
    assert "prompt is too long" in said.lower(), f"exit {done.returncode}:\n{said}"
    assert took < 30.0, f"{took:.1f}s to refuse"  # no prefill, no retries: the gateway refuses at once


def test_codex_exec_answers(up: Up) -> None:
    codex = _need("codex", "@openai/codex")
    home = up.home("codex")
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(f"""
model = "auto"
model_provider = "switchyard"

[model_providers.switchyard]
name = "Switchyard"
base_url = "{up.url}/v1"
wire_api = "responses"
env_key = "SWITCHYARD_API_KEY"
""")
    # Codex's own instructions are ~17 KB; with these the request is ~6k tokens and fits SmolLM2.
    short = home / "instructions.md"
    short.write_text("You are a helpful assistant. Answer the user's question directly and briefly, "
                     "without running any command.\n")
    work = home / "work"
    work.mkdir()
    done, _ = _run([str(codex), "exec", "--skip-git-repo-check", "--sandbox", "read-only",
                    "-c", f"model_instructions_file={short}", QUESTION],
                   home, {"SWITCHYARD_API_KEY": "anything", "CODEX_HOME": str(home / ".codex")}, work)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stdout.strip(), f"no answer; stderr:\n{done.stderr}"
    assert "unexpected status" not in done.stdout + done.stderr, done.stderr
