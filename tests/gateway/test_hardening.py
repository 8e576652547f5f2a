"""The front door, tried as an attacker and as a careless client would: every probe a real gateway
process on loopback, in front of real upstream processes.

No freeze (alias bombs, backtracking regexes, deep JSON), no stuck slot (clients that stop
reading, slow or silent connections), no steering (DNS rebinding, foreign origins), no leak
(upstream error text, upstream keys, query strings, trace files), OpenAI's request shapes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest
from procs import ROOT, free_port, http_get, start_gateway, start_upstream

BODY = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}
BOMB = """version: 1
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
pools: {small: {model: s, replicas: [{url: "http://127.0.0.1:1/v1"}]}}
routes: [{name: d, pool: small, when: {text: *g}}]
"""


def policy_text(url: str, name: str = "p", extra_pool: str = "", routes: str = "  - {name: default, pool: small}\n",
                top: str = "") -> str:
    return (f"version: 1\nname: {name}\n{top}pools:\n  small:\n    model: m\n    replicas: [{{url: '{url}/v1'}}]\n"
            f"{extra_pool}routes:\n{routes}")


def write(tmp: Path, text: str, name: str = "p.yaml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def control(url: str, **settings) -> None:
    httpx.post(url + "/_control", json=settings, timeout=5, trust_env=False)


def upstream_state(url: str) -> dict:
    return httpx.get(url + "/_state", timeout=5, trust_env=False).json()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One upstream and one open-mode gateway for the probes that need no special settings."""
    tmp = tmp_path_factory.mktemp("hard")
    up, url = start_upstream(tmp, "u")
    pol = write(tmp, policy_text(url))
    gw, gurl = start_gateway(tmp, [pol], "--allowed-host", "gw.internal", "--access-log")
    yield tmp, url, gw, gurl, pol
    gw.stop()
    up.stop()


# --- 1. YAML alias bombs ------------------------------------------------------------------


def test_an_alias_bomb_is_refused_fast_by_policy_check(tmp_path):
    p = write(tmp_path, BOMB)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "policy", "check", str(p)], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 1
    assert f"{p}:10: the document expands to" in r.stderr and "YAML aliases" in r.stderr
    assert took < 10, took  # the interpreter's start is most of it; the check itself is milliseconds


def test_an_alias_bomb_never_freezes_a_running_gateway(env):
    tmp, url, gw, gurl, pol = env
    good = pol.read_text()
    lags = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            http_get(gurl + "/health/live", timeout=10)
            lags.append(time.monotonic() - t0)
            time.sleep(0.02)

    t = threading.Thread(target=probe)
    t.start()
    try:
        pol.write_text(BOMB)  # hot reload
        deadline = time.time() + 10
        while "YAML aliases" not in gw.output() and time.time() < deadline:
            time.sleep(0.1)
        r = httpx.post(gurl + "/ui/api/policies/validate", json={"name": "p", "text": BOMB}, timeout=10,
                       trust_env=False)
        assert r.status_code == 200 and not r.json()["ok"]
        assert "YAML aliases" in r.json()["issues"][0]["reason"]
    finally:
        stop.set()
        t.join()
        pol.write_text(good)
    assert "YAML aliases" in gw.output()
    assert max(lags) < 1.0, max(lags)  # the loop kept answering
    assert httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False).status_code == 200


def test_a_huge_flat_policy_is_refused_by_its_node_count_not_the_deadline(env):
    tmp, url, gw, gurl, pol = env
    flat = "version: 1\nname: p\nbig: [" + "1, " * 300_000 + "1]\n"  # ~900 KB, no alias
    t0 = time.monotonic()
    r = httpx.post(gurl + "/ui/api/policies/validate", json={"name": "p", "text": flat}, timeout=30, trust_env=False)
    took = time.monotonic() - t0
    assert r.status_code == 200 and not r.json()["ok"]
    # The node count's reason, not the 5 s deadline's: composing all 300k nodes took ~15 s of CPU.
    assert "50,000 YAML nodes" in r.json()["issues"][0]["reason"], (took, r.text)  # the count before composing


# --- 2. clients that stop reading ---------------------------------------------------------


@pytest.mark.slow  # a socket's timing against a real process: `make test`
def test_a_client_that_stops_reading_frees_its_slot(tmp_path):
    up, url = start_upstream(tmp_path, "big")
    # A ~40 MB stream over 10 s or more: it outlasts the stall, so only the stall can end it, and
    # the upstream notices the cancel while it waits between chunks.
    control(url, stream_chunks=10_000, chunk_pad=4000, chunk_delay_ms=1)
    pol = write(tmp_path, policy_text(url).replace("    model: m\n", "    model: m\n    max_inflight_per_replica: 1\n"
                                                                    "    queue_size: 0\n"))
    gw, gurl = start_gateway(tmp_path, [pol], "--client-timeout", "2")
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", int(gurl.rsplit(":", 1)[1])))
        body = orjson.dumps({**BODY, "stream": True})
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # ... and never read
        deadline = time.time() + 10

        def held() -> int:  # the gateway's own count: the upstream may have sent it all into buffers
            h = httpx.get(gurl + "/health", timeout=5, trust_env=False).json()
            return h["policies"]["p"]["pools"]["small"]["replicas"][0]["inflight"]

        while held() == 0 and time.time() < deadline:
            time.sleep(0.05)
        r = httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False)
        assert r.status_code == 429  # the one slot is held
        t0 = time.monotonic()
        while True:
            r = httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False)
            if r.status_code == 200:
                break
            assert time.monotonic() - t0 < 20, "the stalled client still holds the slot"
            time.sleep(0.2)
        metrics = http_get(gurl + "/metrics")[1].decode()
        assert "switchyard_client_stalls_total 1.0" in metrics
        while upstream_state(url)["cancelled"] == 0:  # the gateway closed its upstream request too
            assert time.monotonic() - t0 < 20, upstream_state(url)
            time.sleep(0.1)
        st = upstream_state(url)
        assert st["cancelled"] == 1 and st["inflight"] == 0, st
        s.close()
    finally:
        gw.stop()
        up.stop()


@pytest.mark.slow  # a socket's timing against a real process: `make test`
def test_the_pool_timeout_bounds_a_whole_stream(tmp_path):
    up, url = start_upstream(tmp_path, "slow")
    control(url, stream_chunks=100, chunk_delay_ms=100)  # 10 s of stream
    pol = write(tmp_path, policy_text(url).replace("    model: m\n", "    model: m\n    timeout: 2s\n"))
    gw, gurl = start_gateway(tmp_path, [pol])
    try:
        t0 = time.monotonic()
        with httpx.stream("POST", gurl + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=30,
                          trust_env=False) as r:
            text = "".join(r.iter_text())
        took = time.monotonic() - t0
        assert took < 5, took
        assert '"error"' in text  # the stream ends with an error event, not silently
    finally:
        gw.stop()
        up.stop()


# --- 3. DNS rebinding and foreign origins -------------------------------------------------


def test_open_mode_answers_loopback_host_names_only(env):
    tmp, url, gw, gurl, pol = env
    port = gurl.rsplit(":", 1)[1]
    for host, want in ((f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200), (f"[::1]:{port}", 200),
                       ("gw.internal", 200), (f"attacker.example:{port}", 403), ("", 403)):
        r = httpx.post(gurl + "/v1/chat/completions", json=BODY, headers={"Host": host}, timeout=10, trust_env=False)
        assert r.status_code == want, (host, r.text)
        if want == 403:
            assert r.json()["error"]["code"] == "host_not_allowed"


def test_open_mode_refuses_writes_from_a_foreign_origin(env):
    tmp, url, gw, gurl, pol = env
    text = pol.read_text()
    r = httpx.post(gurl + "/ui/api/policies/apply", json={"name": "p", "text": text},
                   headers={"Origin": "http://attacker.example"}, timeout=10, trust_env=False)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = httpx.post(gurl + "/v1/chat/completions", json=BODY, headers={"Origin": "http://attacker.example"},
                   timeout=10, trust_env=False)
    assert r.status_code == 403
    r = httpx.post(gurl + "/ui/api/policies/apply", json={"name": "p", "text": text}, headers={"Origin": gurl},
                   timeout=10, trust_env=False)
    assert r.status_code == 200, r.text  # the gateway's own page
    assert httpx.get(gurl + "/health", headers={"Origin": "http://attacker.example"}, timeout=10,
                     trust_env=False).status_code == 200  # reads are not writes


# --- 4. bounded bodies on every route -----------------------------------------------------


def test_ui_routes_refuse_huge_bodies_before_reading_them(env):
    tmp, url, gw, gurl, pol = env
    port = int(gurl.rsplit(":", 1)[1])
    before = rss_kb(gw.p.pid)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /ui/api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 314572800\r\n\r\n" + b"x" * 65536)
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(64):
            yield b"x" * (256 * 1024)

    r = httpx.post(gurl + "/ui/api/policies/validate", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=30, trust_env=False)
    assert r.status_code == 413
    assert rss_kb(gw.p.pid) - before < 40_000  # not 300 MB, not 16 MB


# --- 7. slow and idle connections ---------------------------------------------------------


def _read_until_closed(s: socket.socket, limit: float) -> tuple[bytes, float]:
    s.settimeout(limit)
    t0 = time.monotonic()
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except TimeoutError:
        pass
    return data, time.monotonic() - t0


def _trickle_headers(s: socket.socket) -> float:
    """Send a request's headers a byte every 50 ms until the gateway cuts the connection; the
    seconds it took (~4.6 s if it never does)."""
    t0 = time.monotonic()
    try:
        for b in b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"p" * 40 + b"\r\n":
            s.sendall(bytes([b]))
            time.sleep(0.05)
    except OSError:
        pass
    return time.monotonic() - t0


@pytest.mark.slow  # a socket's timing against a real process: `make test`
def test_slow_silent_and_oversized_connections_are_cut(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url))
    gw, gurl = start_gateway(tmp_path, [pol], "--header-timeout", "0.5", "--body-timeout", "0.5",
                             "--max-connections", "8")
    port = int(gurl.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:  # a silent socket
            data, took = _read_until_closed(s, 10)
            assert data == b"" and took < 4, took
        with socket.create_connection(("127.0.0.1", port)) as s:  # headers a byte at a time
            assert _trickle_headers(s) < 3  # cut at the header time (0.5 s)
        body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}).encode()
        ok = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        for trickle in (False, True):  # after an answer: idle, then headers a byte at a time
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(ok)
                s.settimeout(5)
                first = s.recv(65536)
                assert first.startswith(b"HTTP/1.1 200"), first[:200]
                if trickle:  # the header time runs from the end of the last answer
                    assert _trickle_headers(s) < 3  # cut at the header time (0.5 s)
                else:  # an idle keep-alive connection closes at the header time (0.5 s) at the latest
                    data, took = _read_until_closed(s, 10)
                    assert b"HTTP/1.1 200" not in data and 0.4 < took < 4, took
        with socket.create_connection(("127.0.0.1", port)) as s:  # a body that never finishes
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"mod")
            data, took = _read_until_closed(s, 10)
            assert data.startswith(b"HTTP/1.1 408") and took < 4, (data[:200], took)
        with socket.create_connection(("127.0.0.1", port)) as s:  # headers over 64 KB
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
            data, _ = _read_until_closed(s, 10)
            assert data.startswith(b"HTTP/1.1 431"), data[:200]
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # the connection limit
        try:
            r = httpx.get(gurl + "/health/live", timeout=5, trust_env=False)
            assert r.status_code == 503
        finally:
            for s in held:
                s.close()
        time.sleep(0.3)
        assert httpx.get(gurl + "/health/live", timeout=5, trust_env=False).status_code == 200
    finally:
        gw.stop()
        up.stop()


# --- 8. no open gateway on a network address by accident -----------------------------------


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_serving_a_network_address_without_keys_needs_insecure_open(tmp_path):
    pol = write(tmp_path, policy_text("http://127.0.0.1:9"))
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(pol), "--host", "0.0.0.0",
                        "--port", str(free_port())], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "--insecure-open" in r.stderr and "--auth" in r.stderr
    gw, gurl = start_gateway(tmp_path, [pol], "--host", "0.0.0.0", "--insecure-open")
    try:
        assert httpx.get(gurl + "/health/live", timeout=5, trust_env=False).status_code == 200
    finally:
        gw.stop()


# --- 9, 10, 16: health, metrics, the UI's login, the admin key --------------------------------


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_health_and_metrics_details_need_the_admin_key(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url))
    keyfile = tmp_path / "admin.key"
    keyfile.write_text("adm-" + "k" * 40 + "\n")
    os.chmod(keyfile, 0o600)
    keys = tmp_path / "keys.json"
    gw, gurl = start_gateway(tmp_path, [pol], "--auth", "--keys-file", str(keys), "--admin-key-file", str(keyfile))
    admin = {"Authorization": "Bearer adm-" + "k" * 40}
    try:
        public = httpx.get(gurl + "/health", timeout=5, trust_env=False).json()
        assert set(public) == {"status", "ready"}
        full = httpx.get(gurl + "/health", headers=admin, timeout=5, trust_env=False).json()
        assert url in json.dumps(full["policies"])
        assert httpx.get(gurl + "/metrics", timeout=5, trust_env=False).status_code == 401
        assert httpx.get(gurl + "/metrics", headers=admin, timeout=5, trust_env=False).status_code == 200
        assert "adm-" not in " ".join(gw.p.args)  # the key came from the file, not the command line
    finally:
        gw.stop()
        up.stop()


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_ui_sessions_are_random_expire_on_logout_and_failed_logins_slow_down(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url))
    key = "adm-" + "z" * 40
    gw, gurl = start_gateway(tmp_path, [pol], "--admin-key", key)
    try:
        with httpx.Client(base_url=gurl, timeout=5, trust_env=False) as c:
            tokens = []
            for _ in range(2):
                r = c.post("/ui/api/login", json={"key": key})
                assert r.status_code == 200
                tokens.append(r.cookies["switchyard_ui"])
                assert "httponly" in r.headers["set-cookie"].lower() and "samesite=strict" in r.headers["set-cookie"].lower()
            assert tokens[0] != tokens[1] and key not in tokens[0]
            c.cookies.clear()
            c.cookies.set("switchyard_ui", tokens[0])
            assert c.get("/ui/api/live").status_code == 200
            assert c.post("/ui/api/logout").status_code == 200
            c.cookies.set("switchyard_ui", tokens[0])  # a browser that kept the cookie anyway
            assert c.get("/ui/api/live").status_code == 401  # revoked on the server
            c.cookies.clear()
            codes = [c.post("/ui/api/login", json={"key": "wrong"}).status_code for _ in range(7)]
            assert codes[:5] == [401] * 5 and 429 in codes[5:]
            r = c.post("/ui/api/login", json={"key": key})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1  # even the right key waits
    finally:
        gw.stop()
        up.stop()


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_ui_sessions_expire_on_the_server(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url))
    key = "adm-" + "e" * 40
    gw, gurl = start_gateway(tmp_path, [pol], "--admin-key", key, "--ui-session-ttl", "1", "--trusted-proxy", "127.0.0.1")
    try:
        with httpx.Client(base_url=gurl, timeout=5, trust_env=False) as c:
            r = c.post("/ui/api/login", json={"key": key})
            assert r.status_code == 200
            cookie = r.headers["set-cookie"].lower()
            assert "max-age=1" in cookie and "secure" not in cookie  # plain http: no Secure
            token = r.cookies["switchyard_ui"]
            c.cookies.clear()
            c.cookies.set("switchyard_ui", token)
            assert c.get("/ui/api/live").status_code == 200
            time.sleep(1.5)
            c.cookies.set("switchyard_ui", token)  # a browser that ignored Max-Age
            assert c.get("/ui/api/live").status_code == 401  # the server forgot the token
            assert c.get("/ui/api/session").json() == {"auth": "admin", "ok": False}
            c.cookies.clear()
            assert c.get("/ui/api/live", headers={"Authorization": f"Bearer {key}"}).status_code == 200
            # Behind a TLS proxy on this host (named with --trusted-proxy: none is trusted by default).
            r = c.post("/ui/api/login", json={"key": key}, headers={"X-Forwarded-Proto": "https"})
            assert r.status_code == 200 and "; secure" in r.headers["set-cookie"].lower()
    finally:
        gw.stop()
        up.stop()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    return cert, key


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_the_ui_cookie_is_secure_over_tls(tmp_path):
    cert, tls_key = _self_signed(tmp_path)
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url))
    key = "adm-" + "t" * 40
    gw, gurl = start_gateway(tmp_path, [pol], "--admin-key", key, "--ssl-certfile", str(cert),
                             "--ssl-keyfile", str(tls_key))
    assert gurl.startswith("https://")
    try:
        with httpx.Client(base_url=gurl, timeout=5, trust_env=False, verify=False) as c:
            r = c.post("/ui/api/login", json={"key": key})
            assert r.status_code == 200
            cookie = r.headers["set-cookie"].lower()
            assert "; secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
            assert c.get("/ui/api/live").status_code == 200  # the cookie works over TLS
            assert c.post("/v1/chat/completions", json=BODY).status_code == 200  # and so does the proxy
    finally:
        gw.stop()
        up.stop()


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_the_admin_key_from_the_environment_never_shows_in_ps(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url))
    key = "adm-env-" + "q" * 36
    gw, gurl = start_gateway(tmp_path, [pol], env={"SWITCHYARD_ADMIN_KEY": key})
    try:
        with httpx.Client(base_url=gurl, timeout=5, trust_env=False) as c:
            assert c.get("/admin/replicas", headers={"Authorization": f"Bearer {key}"}).status_code == 200
            assert c.get("/admin/replicas").status_code == 401
            assert c.get("/admin/replicas", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.post("/ui/api/login", json={"key": key}).status_code == 200  # the UI takes it too
        ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, timeout=10).stdout
        assert str(gw.p.pid) in ps and "switchyard.cli serve" in ps
        assert key not in ps
        assert key.encode() not in Path(f"/proc/{gw.p.pid}/cmdline").read_bytes()
    finally:
        gw.stop()
        up.stop()


# --- 11, 12: regexes and deep JSON ------------------------------------------------------------


def test_a_backtracking_regex_cannot_stall_routing(env, tmp_path):
    tmp, url, gw, gurl, pol = env
    good = pol.read_text()
    pol.write_text(policy_text(url, routes="  - {name: evil, when: {text: '(a+)+$'}, pool: small}\n"
                                           "  - {name: default, pool: small}\n"))
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            r = httpx.post(gurl + "/v1/route", json=BODY, timeout=10, trust_env=False)
            if r.json()["trace"][0]["rule"] == "evil":
                break
            time.sleep(0.1)
        body = {**BODY, "messages": [{"role": "user", "content": "a" * 60_000 + "b"}]}
        t0 = time.monotonic()
        r = httpx.post(gurl + "/v1/route", json=body, timeout=10, trust_env=False)
        assert r.status_code == 200 and r.json()["rule"] == "default"
        assert time.monotonic() - t0 < 0.5
        r = httpx.post(gurl + "/ui/api/policies/preview", json={"name": "p", "text": pol.read_text(), "request": body},
                       timeout=10, trust_env=False)
        assert r.status_code == 200 and r.json()["edited"]["rule"] == "default"
    finally:
        pol.write_text(good)
    bad = write(tmp_path, policy_text(url, routes="  - {name: r, when: {text: '(a)\\1'}, pool: small}\n"), "bad.yaml")
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "policy", "check", str(bad)], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1 and f"{bad}:8:" in r.stderr and "backreferences" in r.stderr, r.stderr


def test_json_nested_too_deep_is_a_400(env):
    tmp, url, gw, gurl, pol = env
    deep = b"[" * 300 + b"]" * 300
    raw = b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "metadata": {"x": ' + deep + b"}}"
    r = httpx.post(gurl + "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"},
                   timeout=10, trust_env=False)
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"]
    # The UI's bodies take the same check: the preview would otherwise fail to encode its answer.
    ui = (b'{"name": "p", "text": ' + orjson.dumps(pol.read_text()) + b', "request": {"messages": '
          b'[{"role": "user", "content": "x"}], "metadata": {"x": ' + deep + b"}}}")
    for route in ("/ui/api/policies/preview", "/ui/api/policies/validate", "/ui/api/login"):
        r = httpx.post(gurl + route, content=ui, headers={"Content-Type": "application/json"}, timeout=10,
                       trust_env=False)
        assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"], (route, r.text)
    shallow = ui.replace(deep, b"[[1]]")
    r = httpx.post(gurl + "/ui/api/policies/preview", content=shallow, headers={"Content-Type": "application/json"},
                   timeout=10, trust_env=False)
    assert r.status_code == 200, r.text


# --- 13: classifier paths ----------------------------------------------------------------------


def test_a_policy_cannot_load_a_classifier_from_elsewhere(tmp_path):
    p = write(tmp_path, policy_text("http://127.0.0.1:9", top="classifier: {kind: onnx, path: /etc/passwd}\n"))
    q = write(tmp_path, policy_text("http://127.0.0.1:9", top="classifier: {kind: onnx, path: /etc/no-such}\n"),
              "q.yaml")
    out = []
    for f in (p, q):
        r = subprocess.run([sys.executable, "-m", "switchyard.cli", "policy", "check", str(f)], capture_output=True,
                           text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 1
        out.append(r.stderr.replace(str(f), "F").replace("/etc/passwd", "P").replace("/etc/no-such", "P"))
    assert out[0] == out[1] and "not found or not readable" in out[0]  # existing and missing look alike


def _serve_fails(pol: Path, *extra: str) -> str:
    """The one line a gateway that cannot start prints about its classifier."""
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(pol), "--port",
                        str(free_port()), *extra], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "classifier" in ln]
    assert len(lines) == 1, r.stderr[-2000:]
    return lines[0]


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_classifier_dir_widens_where_a_policy_may_load_a_model(tmp_path):
    models, pols = tmp_path / "models", tmp_path / "policies"
    models.mkdir()
    pols.mkdir()
    for suffix in (".onnx", ".json"):
        shutil.copy(ROOT / "classifiers" / f"tool-complexity{suffix}", models)
    (models / "dir.onnx").mkdir()  # a path that exists but cannot be read as a model file

    def policy(model: str, name: str) -> Path:
        return write(pols, policy_text("http://127.0.0.1:9", top=f"classifier: {{kind: onnx, path: '{model}', "
                                                                 "labels: [simple, complex]}\n"), name)

    good = policy(str(models / "tool-complexity.onnx"), "good.yaml")
    line = _serve_fails(good)  # outside the policy's folder and the shipped one: refused without the flag
    assert "not found or not readable" in line
    gw, gurl = start_gateway(tmp_path, [good], "--classifier-dir", str(models), "--no-health-checks")
    try:
        r = httpx.post(gurl + "/v1/route", json=BODY, timeout=10, trust_env=False)
        assert r.status_code == 200 and r.json()["label"] in ("simple", "complex"), r.text
    finally:
        gw.stop()
    # With the flag, a missing file and one that cannot be read get the same one error.
    cases = {"missing": models / "gone.onnx", "a directory": models / "dir.onnx"}
    if os.geteuid() != 0:  # root reads a file whatever its mode says
        (models / "locked.onnx").write_bytes(b"x")
        os.chmod(models / "locked.onnx", 0)
        cases["mode 000"] = models / "locked.onnx"
    seen = {}
    for what, model in cases.items():
        line = _serve_fails(policy(str(model), "p.yaml"), "--classifier-dir", str(models))
        seen[what] = line.replace(str(model), "MODEL")
    assert len(set(seen.values())) == 1, seen
    assert "not found or not readable" in seen["missing"]


# --- 14, 15: upstream keys and upstream error text ---------------------------------------------


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_api_key_from_the_environment_and_never_shown(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    up2, url2 = start_upstream(tmp_path, "v")
    text = policy_text(url, extra_pool=f"  other:\n    model: o\n    api_key: sk-literal-secret\n"
                                       f"    replicas: [{{url: '{url2}/v1'}}]\n")
    text = text.replace("    model: m\n", "    model: m\n    api_key: '${SWITCHYARD_TEST_UPSTREAM_KEY}'\n")
    pol = write(tmp_path, text)
    os.environ["SWITCHYARD_TEST_UPSTREAM_KEY"] = "sk-from-env"
    try:
        gw, gurl = start_gateway(tmp_path, [pol])
    finally:
        del os.environ["SWITCHYARD_TEST_UPSTREAM_KEY"]
    try:
        assert httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False).status_code == 200
        assert upstream_state(url)["last_headers"]["authorization"] == "Bearer sk-from-env"
        shown = httpx.get(gurl + "/ui/api/policies", timeout=5, trust_env=False).json()["policies"][0]["text"]
        assert "sk-literal-secret" not in shown and "<redacted>" in shown and "${SWITCHYARD_TEST_UPSTREAM_KEY}" in shown
        # An edit sent back with the redacted value keeps the key that serves.
        r = httpx.post(gurl + "/ui/api/policies/apply", json={"name": "p", "text": shown + "# edited\n"},
                       timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        assert "sk-literal-secret" in pol.read_text()
        assert httpx.post(gurl + "/v1/chat/completions", json={**BODY, "model": "other"}, timeout=10,
                          trust_env=False).status_code == 200
        assert upstream_state(url2)["last_headers"]["authorization"] == "Bearer sk-literal-secret"
    finally:
        gw.stop()
        up.stop()
        up2.stop()
    missing = write(tmp_path, text, "missing.yaml")
    r = subprocess.run([sys.executable, "-m", "switchyard.cli", "serve", "--policy", str(missing), "--port",
                        str(free_port())], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "SWITCHYARD_TEST_UPSTREAM_KEY"})
    assert r.returncode == 1 and "SWITCHYARD_TEST_UPSTREAM_KEY is not set" in r.stderr


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_upstream_error_text_and_refused_credentials_stay_in_the_log(tmp_path):
    up, url = start_upstream(tmp_path, "u")
    pol = write(tmp_path, policy_text(url).replace("    model: m\n", "    model: m\n    retries: 0\n"))
    gw, gurl = start_gateway(tmp_path, [pol], "--no-health-checks")
    secret = "postgres://app:hunter2@db.internal/prod"
    try:
        control(url, fail=503, fail_message=f"connection to {secret} refused")
        r = httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False)
        assert r.status_code == 502 and "hunter2" not in r.text and "request id req_" in r.text
        rid = r.json()["error"]["message"].rsplit("request id ", 1)[1].rstrip(")")
        assert "hunter2" not in httpx.get(gurl + "/health", timeout=5, trust_env=False).text
        control(url, fail=401, fail_message="invalid key sk-gateway-upstream-key")
        r = httpx.post(gurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_auth_failed"
        assert "sk-gateway" not in r.text
        log = gw.output()
        assert rid in log and "hunter2" in log and "sk-gateway-upstream-key" in log  # the operator sees it
    finally:
        gw.stop()
        up.stop()


# --- 16: access logs and trace files -------------------------------------------------------------


@pytest.mark.slow  # its own gateway process (a flag, the environment, a log): `make test`
def test_access_log_without_query_strings_and_private_trace_files(env, tmp_path):
    tmp, url, gw, gurl, pol = env
    httpx.get(gurl + "/health?token=sekrit-token", timeout=5, trust_env=False)
    time.sleep(0.2)
    assert "GET /health" in gw.output() and "sekrit-token" not in gw.output()
    trace = tmp_path / "trace.jsonl"
    rec, rurl = start_gateway(tmp_path, [pol], "--record", str(trace), name="rec")
    try:
        assert httpx.post(rurl + "/v1/chat/completions", json=BODY, timeout=10, trust_env=False).status_code == 200
    finally:
        rec.stop()
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600


# --- OpenAI's request shapes ------------------------------------------------------------------------


def test_openai_request_shapes(env):
    tmp, url, gw, gurl, pol = env
    cases = [
        ({"model": "auto", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "auto", "messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({**BODY, "tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
        ({**BODY, "tools": [{"type": "function"}]}, "tools[0].function"),
    ]
    for body, param in cases:
        r = httpx.post(gurl + "/v1/chat/completions", json=body, timeout=10, trust_env=False)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    ok = {**BODY, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "r"}], "x_vendor_field": {"keep": True}}
    r = httpx.post(gurl + "/v1/chat/completions", json=ok, timeout=10, trust_env=False)
    assert r.status_code == 200
    assert upstream_state(url)["last_body"]["x_vendor_field"] == {"keep": True}  # unknown fields pass through
