"""`switchyard up` end to end: replicas (TP=1 and TP=3) + gateway from a copy of
policies/default.yaml on free ports; the OpenAI SDK asks about France; SIGTERM stops it all."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from procs import ROOT, free_port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_up_end_to_end(gguf_path: Path, tmp_path: Path) -> None:
    from openai import OpenAI

    small, large, gw = free_port(), free_port(), free_port()
    text = (ROOT / "policies" / "default.yaml").read_text()
    assert "127.0.0.1:8101/v1" in text and "127.0.0.1:8201/v1" in text
    text = text.replace("127.0.0.1:8101/v1", f"127.0.0.1:{small}/v1").replace("127.0.0.1:8201/v1",
                                                                              f"127.0.0.1:{large}/v1")
    # Keep the test's KV caches small (one full window a replica); everything else as shipped.
    assert text.count('"--num-kv-blocks", "2048"') == 2
    text = text.replace('"--num-kv-blocks", "2048"', '"--num-kv-blocks", "512"')
    policy = tmp_path / "default.yaml"
    policy.write_text(text)
    log = (tmp_path / "up.out").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "switchyard.cli", "up", "--policy", str(policy), "--port",
                             str(gw), "--log-dir", str(tmp_path / "logs")], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while "Switchyard is up" not in (tmp_path / "up.out").read_text():
            assert proc.poll() is None, (tmp_path / "up.out").read_text()
            assert time.monotonic() < deadline, (tmp_path / "up.out").read_text()
            time.sleep(0.5)
        assert f"http://127.0.0.1:{gw}/v1" in (tmp_path / "up.out").read_text()
        client = OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="none", timeout=120)
        reply = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0, max_tokens=30)
        assert "Paris" in reply.choices[0].message.content
        # The shipped replicas run the 4-bit file on int4 matmuls, on our kernel where the CPU allows.
        from switchyard.engine.backends.cpu.native import load as load_native

        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{small}/health", timeout=5).read())
        assert health["dtype"] == "int4", health
        native = load_native()[0] is not None
        assert health["device"]["int4_kernel"].startswith("native" if native else "torch"), health
        # ... and their KV cache in float16 where the native attention reads it.
        assert health["device"]["kv_cache_dtype"] == ("float16" if native else "float32"), health
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "up.out").read_text()
        for port in (small, large, gw):
            assert not _listening(port), f"port {port} still open after up stopped"
        # An orderly shutdown logs as one: no replica (the TP=3 one included) records an error.
        for f in (tmp_path / "logs").glob("*.log"):
            text = f.read_text(errors="replace")
            assert "ERROR" not in text and "Traceback" not in text, f"{f.name}:\n{text[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
