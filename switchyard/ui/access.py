"""Who may use the UI: anyone when the gateway has no keys (it then serves loopback only); the
admin key holder otherwise.

The page logs in once with the admin key (POST /ui/api/login) and gets an HttpOnly,
SameSite=Strict cookie holding a random session token (Secure when served over TLS, or behind
a trusted proxy that forwards https), so the replay reports' iframe and images load too and page
scripts never see the key. The gateway keeps the tokens: each expires after `ttl` (8 h unless
`serve --ui-session-ttl` says) and logout revokes it at once. Failed logins from one address
slow down exponentially (429 with Retry-After). Scripts may send
`Authorization: Bearer ADMIN_KEY` instead. With API keys on (--auth) and no admin key, the UI
stays locked: it can rewrite policies.

Sessions live in this gateway's memory: behind a load balancer, pin /ui to one gateway (or send
the Bearer header).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable, Mapping

from switchyard.gateway.auth import check_admin

COOKIE = "switchyard_ui"
SESSION_TTL_S = 8 * 3600.0
MAX_SESSIONS = 1024
FREE_FAILURES = 5  # failed logins from one address before each next try must wait
MAX_WAIT_S = 300.0


class UiAccess:
    def __init__(self, admin_key: str | None, keys_on: bool, clock: Callable[[], float] = time.monotonic,
                 ttl: float = SESSION_TTL_S) -> None:
        if ttl <= 0:
            raise ValueError(f"a UI session must last some time, not {ttl:g}s")
        self.admin_key = admin_key
        self.ttl = ttl
        self.mode = "admin" if admin_key else ("locked" if keys_on else "open")
        self._clock = clock
        self._sessions: dict[str, float] = {}  # token -> expiry
        self._failures: dict[str, tuple[int, float]] = {}  # client address -> (failures, may retry at)

    def allowed(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> bool:
        if self.mode == "open":
            return True
        if self.mode == "locked" or self.admin_key is None:
            return False
        if check_admin(headers, self.admin_key):
            return True
        token = cookies.get(COOKIE, "")
        expiry = self._sessions.get(token) if token else None
        if expiry is None:
            return False
        if expiry < self._clock():
            self._sessions.pop(token, None)
            return False
        return True

    def retry_after(self, client: str) -> float:
        """Seconds this address must still wait before its next login try (0: it may try now)."""
        failures = self._failures.get(client)
        return max(0.0, failures[1] - self._clock()) if failures else 0.0

    def login(self, key: str, client: str) -> str | None:
        """A new session token for the right key; None (and a longer wait next time) otherwise."""
        if self.admin_key is None:
            return None
        if not hmac.compare_digest(key.encode(), self.admin_key.encode()):
            n, _ = self._failures.get(client, (0, 0.0))
            n += 1
            wait = 0.0 if n < FREE_FAILURES else min(MAX_WAIT_S, 2.0 ** (n - FREE_FAILURES))
            if len(self._failures) >= 10_000:
                self._failures.clear()
            self._failures[client] = (n, self._clock() + wait)
            return None
        self._failures.pop(client, None)
        now = self._clock()
        if len(self._sessions) >= MAX_SESSIONS:
            self._sessions = {t: e for t, e in self._sessions.items() if e >= now}
            while len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
        token = secrets.token_urlsafe(32)
        self._sessions[token] = now + self.ttl
        return token

    def logout(self, cookies: Mapping[str, str]) -> None:
        self._sessions.pop(cookies.get(COOKIE, ""), None)
