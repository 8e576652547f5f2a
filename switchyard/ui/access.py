"""Who may use the UI: anyone when the gateway has no keys; the admin key holder otherwise.

The page logs in once with the admin key (POST /ui/api/login); the gateway answers with an
HttpOnly, SameSite=Strict cookie holding an HMAC of the key (never the key itself), so the
replay reports' iframe and images load too and page scripts never see the key. Scripts may
send `Authorization: Bearer ADMIN_KEY` instead. With API keys on (--auth) and no admin key,
the UI stays locked: it can rewrite policies.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from switchyard.gateway.auth import check_admin

COOKIE = "switchyard_ui"


class UiAccess:
    def __init__(self, admin_key: str | None, keys_on: bool):
        self.admin_key = admin_key
        self.mode = "admin" if admin_key else ("locked" if keys_on else "open")
        self.token = hmac.new(admin_key.encode(), b"switchyard-ui-session", hashlib.sha256).hexdigest() \
            if admin_key else ""

    def allowed(self, headers: Mapping[str, str], cookies: dict[str, str]) -> bool:
        if self.mode == "open":
            return True
        if self.mode == "locked" or self.admin_key is None:
            return False
        if check_admin(headers, self.admin_key):
            return True
        got = cookies.get(COOKIE, "")
        return bool(got) and hmac.compare_digest(got.encode(), self.token.encode())

    def login(self, key: str) -> bool:
        return self.admin_key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())
