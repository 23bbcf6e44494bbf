"""Bearer API keys: `Authorization: Bearer <key>` on HTTP, the same in gRPC metadata."""

import hmac

from gateway.errors import Unauthenticated


class ApiKeys:
    def __init__(self, keys: frozenset[str], is_disabled: bool) -> None:
        self.keys = [k.encode() for k in keys]
        self.is_disabled = is_disabled

    def check(self, authorization: str | None) -> str:
        """The caller's key (its identity for per-key limits; "" with auth disabled); raises Unauthenticated
        unless the header carries a known key."""
        if self.is_disabled:
            return ""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
        given = authorization[7:].strip()
        if not any(hmac.compare_digest(given.encode(), k) for k in self.keys):
            raise Unauthenticated("invalid API key")
        return given
