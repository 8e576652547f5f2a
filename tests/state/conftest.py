"""Real redis-server processes, upstreams and gateways on loopback for the shared-state tests.

One Redis and one pair of gateways (A, B) per test session; tests that kill things start
their own. Without a redis-server binary the tests skip, except under CI (env CI set),
where they fail: shared state must be tested there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from procs import Proc, start_gateway, start_upstream, stop_all
from statekit import RedisServer, Shared, write_policies


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Iterator[Shared]:
    tmp = tmp_path_factory.mktemp("shared")
    rs = RedisServer(tmp)
    ups: dict[str, tuple[Proc, str]] = {}
    gws: list[Proc] = []
    try:
        for n in ("s0", "s1", "l0", "b0", "b1", "e0", "e1"):
            ups[n] = start_upstream(tmp, n)
        pa, pb = write_policies(tmp, ups)
        a, a_url = start_gateway(tmp, [pa], "--redis", rs.url, "--admin-key", "adm-secret", name="gw-a")
        gws.append(a)
        b, b_url = start_gateway(tmp, [pb], "--redis", rs.url, "--admin-key", "adm-secret", name="gw-b")
        gws.append(b)
        yield Shared(tmp, rs, ups, pa, pb, a, a_url, b, b_url)
    finally:
        stop_all([*gws, *(proc for proc, _ in ups.values())])
        rs.stop()


@pytest.fixture
def fresh(shared: Shared) -> Shared:
    for name, (proc, _) in shared.ups.items():
        if proc.p.poll() is None:
            shared.control(name, delay_ms=0, fail=0, fail_first=0, chunk_delay_ms=0)
    return shared


