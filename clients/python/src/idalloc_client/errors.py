"""One exception hierarchy for everything the client raises.

Every error answer of the service (``{"kind", "message"}`` with a status, docs/guide/api.md) is an
:class:`IdallocError` of the subclass of its kind; no answer at all (refused, reset, timed out,
TLS failed) is a :class:`TransportError`, never a bare ``URLError`` or ``OSError``. No text,
``repr`` or log line of the client holds a session id or a token.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

RETRYABLE_KINDS = frozenset({"unavailable", "overloaded", "rate_limited", "pool_replaced"})


class IdallocError(Exception):
    """An error of the client: the service's status, kind and message, and the call it was."""

    def __init__(self, status: int, kind: str, message: str, op: str = "",
                 retry_after: float = 0.0) -> None:
        super().__init__(status, kind, message)
        self.status, self.kind, self.message, self.op = status, kind, message, op
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f"{self.op}: " if self.op else ""
        return f"{where}{self.status} {self.kind}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.kind!r}, {self.message!r})"

    @property
    def retryable(self) -> bool:
        """Whether the same call may succeed on this or another replica (docs/guide/api.md)."""
        if self.kind in RETRYABLE_KINDS:
            return True
        return self.kind == "" and 502 <= self.status <= 504


class Unauthenticated(IdallocError):
    """401: no token, or one the service does not know."""


class Forbidden(IdallocError):
    """403: the token's scope or grants do not cover the call."""


class RateLimited(IdallocError):
    """429 rate_limited: retried after ``Retry-After``."""


class QuotaExceeded(IdallocError):
    """429 quota_exceeded: the client is at its sessions= or refs= limit."""


class InvalidInput(IdallocError):
    """400 invalid_input (or a value the client refused before sending it)."""


class PoolInUse(InvalidInput):
    """409 invalid_input: deleting a pool that still has records, without force."""


class PoolNotFound(IdallocError):
    """404: the pool has no spec."""


class NotFound(IdallocError):
    """404: no ID for that key, no key for that ID."""


class SessionNotFound(IdallocError):
    """404: the session is over (ended, expired, or another client's); its references are gone."""


class RangeMismatch(IdallocError):
    """409: a different spec is stored under that pool name."""


class HolderReserved(IdallocError):
    """409: a durable holder named like a session's holder."""


class PoolReplaced(IdallocError):
    """409: the pool was deleted and re-created; retried."""


class Exhausted(IdallocError):
    """409: every allocatable ID is bound or in its reuse delay."""


class Conflict(IdallocError):
    """409: a held key lost its ID to another key and was rebound."""


class TooLarge(IdallocError):
    """413: the body is over the service's limit."""


class Overloaded(IdallocError):
    """503 overloaded: retried with back-off on another replica."""


class UnsupportedMediaType(IdallocError):
    """415."""


class MethodNotAllowed(IdallocError):
    """405."""


class Gone(IdallocError):
    """410: a watch resumed from a revision older than the service's history."""


class Internal(IdallocError):
    """500 internal: a bug of the service."""


class Unavailable(IdallocError):
    """503 unavailable: the store did not answer in time, or the service is shutting down."""


class TransportError(Unavailable):
    """No endpoint answered (connection refused or reset, timeout, TLS failure)."""

    def __init__(self, op: str, endpoint: str, reason: str) -> None:
        super().__init__(0, "unavailable", f"no endpoint answered (last {endpoint}: {reason})", op)
        self.endpoint = endpoint

    @property
    def retryable(self) -> bool:
        return True


class AccessDenied(IdallocError):
    """503 access_denied: the store refused the service's credentials."""


class Corrupt(IdallocError):
    """500 corrupt: the store holds data idalloc cannot use."""


class BadAnswer(IdallocError):
    """A 2xx answer whose body is not what the API documents."""


class SessionLost(IdallocError):
    """The session's lease is gone (expired or ended elsewhere): its references are gone."""


KINDS: Dict[str, Type[IdallocError]] = {
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "rate_limited": RateLimited,
    "quota_exceeded": QuotaExceeded,
    "invalid_input": InvalidInput,
    "pool_not_found": PoolNotFound,
    "not_found": NotFound,
    "session_not_found": SessionNotFound,
    "range_mismatch": RangeMismatch,
    "holder_reserved": HolderReserved,
    "pool_replaced": PoolReplaced,
    "exhausted": Exhausted,
    "conflict": Conflict,
    "too_large": TooLarge,
    "overloaded": Overloaded,
    "unsupported_media_type": UnsupportedMediaType,
    "method_not_allowed": MethodNotAllowed,
    "gone": Gone,
    "internal": Internal,
    "unavailable": Unavailable,
    "access_denied": AccessDenied,
    "corrupt": Corrupt,
}


def from_answer(status: int, kind: Optional[str], message: str, op: str,
                retry_after: float = 0.0) -> IdallocError:
    """The exception for an error answer (``kind`` None: not the service's error JSON)."""
    if kind is None:
        cls: Type[IdallocError] = Unavailable if 502 <= status <= 504 else IdallocError
        return cls(status, "", message or "an answer without the service's error body (a proxy?)",
                   op, retry_after)
    if kind == "invalid_input" and status == 409:
        return PoolInUse(status, kind, message, op, retry_after)
    return KINDS.get(kind, IdallocError)(status, kind, message, op, retry_after)
