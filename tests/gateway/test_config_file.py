"""`switchyard serve --config FILE`: options from YAML, the command line wins, typos are refused."""

from __future__ import annotations

import subprocess
import sys

from procs import ROOT, Proc, free_port, http_get, start_upstream


def test_gateway_config_file(tmp_path):
    up, uurl = start_upstream(tmp_path, "u")
    (tmp_path / "p.yaml").write_text(
        f"version: 1\nname: cfg\npools:\n  a: {{model: m, replicas: [{{url: {uurl}/v1}}]}}\n"
        "routes:\n  - {name: r, pool: a}\n")
    port = free_port()
    conf = tmp_path / "gateway.yaml"
    conf.write_text(f"policies: [p.yaml]\nport: {port}\nui: false\nhost: 127.0.0.1\n")  # relative to the file
    gw = Proc([sys.executable, "-m", "switchyard.cli", "serve", "--config", str(conf)],
              f"http://127.0.0.1:{port}/health", tmp_path / "gw.log")
    try:
        assert http_get(f"http://127.0.0.1:{port}/ui")[0] == 404  # ui: false applied
        assert b'"cfg"' in http_get(f"http://127.0.0.1:{port}/v1/models")[1]
    finally:
        gw.stop()
        up.stop()
    conf.write_text("prot: 9000\n")
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "serve", "--config", str(conf)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "unknown option 'prot'" in r.stderr
