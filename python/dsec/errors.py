"""Exceptions mirroring the server's error-code registry (packages/sdk/src/errors.ts).

The server answers ``{"error": {"code", "message", "details"}}``; the class is chosen by ``code``
(not by HTTP status), so a caller can catch what it acts on: ``CapacityError``,
``UnavailableError`` and ``RateLimitError`` are ``retryable``, a ``NotFoundError`` is not worth
retrying.
"""

from __future__ import annotations

import builtins
from typing import Any, Dict, Mapping, Optional, Type


class DsecError(Exception):
    """Root of every error the SDK raises."""

    #: True when the same call may succeed later unchanged: ``CapacityError``, ``UnavailableError``,
    #: ``RateLimitError`` (the TypeScript SDK's ``retryable`` is true for the same codes).
    retryable: bool = False

    def __init__(self, message: str, code: str, status: Optional[int] = None, details: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details: Dict[str, Any] = dict(details or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class NotFoundError(DsecError):
    """The sandbox, image, file, session or process does not exist (any more)."""


class AuthError(DsecError):
    """The API key is missing, wrong, or not allowed to do this (FILE_PERMISSION_DENIED: the sandbox's kernel refused a file call made as one of its users)."""


class ConflictError(DsecError):
    """The target is in the wrong state (paused, not running, session closed, path exists)."""


class InvalidRequestError(DsecError):
    """The request is malformed; ``details['field']`` names the field when there is one."""


class CapacityError(DsecError):
    """No room right now (CAPACITY_EXCEEDED, NODE_MEMORY_PRESSURE: on the nodes; OUTPUT_BUDGET_EXCEEDED: in the
    control plane's budget of buffered output); retry later, or ask for less."""

    retryable = True


class RateLimitError(DsecError):
    """Too many requests (QUOTA_CREATE_RATE_EXCEEDED: the project's create rate); retry after
    ``details["retryAfterMs"]``."""

    retryable = True


class UnavailableError(DsecError):
    """A node or registry the call needs is unreachable for now (EDGE_UNAVAILABLE, REGISTRY_UNAVAILABLE;
    e.g. its edge is restarting); retry later."""

    retryable = True


class QuotaError(DsecError):
    """The project's quota is used up (``code`` names it: QUOTA_SANDBOXES_EXCEEDED, QUOTA_CPU_EXCEEDED,
    QUOTA_MEMORY_EXCEEDED; ``details`` has quota, limit, used, requested); kill sandboxes or raise the quota."""


class ServerError(DsecError):
    """The server failed (create failed, exec failed, internal error); ``message`` says why."""


class TimeoutError(DsecError, builtins.TimeoutError):  # noqa: A001 - mirrors the TS SDK's name
    """The call did not finish within its timeout (also caught by ``except builtins.TimeoutError``)."""


class UnreachableError(DsecError, builtins.ConnectionError):
    """The server could not be reached, or the connection broke mid-call."""


class NotConfiguredError(DsecError):
    """No server configured: set DSEC_URL and DSEC_API_KEY, or run ``dsec up``."""


class CommandExitError(DsecError):
    """Raised by ``run(..., check=True)`` when a command exits non-zero."""

    def __init__(self, exit_code: int, stdout: Any, stderr: Any) -> None:
        super().__init__(f"command exited with code {exit_code}", "COMMAND_EXIT", None, {"exitCode": exit_code})
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


#: The registry's codes (packages/sdk/src/errors.ts) and the class each maps to: the same table
#: as the TypeScript SDK's ERROR_CLASSES (a unit test compares the two and checks that every
#: registry code is here). Codes the server may add later fall back to the HTTP status (see
#: ``error_from_wire``).
CODE_CLASSES: Dict[str, Type[DsecError]] = {
    "INVALID_REQUEST": InvalidRequestError,
    "BACKEND_UNSUPPORTED": InvalidRequestError,
    "PAYLOAD_TOO_LARGE": InvalidRequestError,
    "UNSUPPORTED_MEDIA_TYPE": InvalidRequestError,
    "RANGE_NOT_SATISFIABLE": InvalidRequestError,
    "UNAUTHORIZED": AuthError,
    "FORBIDDEN": AuthError,
    "REGISTRY_AUTH_FAILED": AuthError,
    "FILE_PERMISSION_DENIED": AuthError,
    "QUOTA_SANDBOXES_EXCEEDED": QuotaError,
    "QUOTA_CPU_EXCEEDED": QuotaError,
    "QUOTA_MEMORY_EXCEEDED": QuotaError,
    "QUOTA_CREATE_RATE_EXCEEDED": RateLimitError,
    "SANDBOX_NOT_FOUND": NotFoundError,
    "IMAGE_NOT_FOUND": NotFoundError,
    "FILE_NOT_FOUND": NotFoundError,
    "ROUTE_NOT_FOUND": NotFoundError,
    "SESSION_NOT_FOUND": NotFoundError,
    "PROCESS_NOT_FOUND": NotFoundError,
    "BLOB_NOT_FOUND": NotFoundError,
    "EDGE_NOT_FOUND": NotFoundError,
    "BATCH_NOT_FOUND": NotFoundError,
    "VOLUME_NOT_FOUND": NotFoundError,
    "POOL_NOT_FOUND": NotFoundError,
    "PROJECT_NOT_FOUND": NotFoundError,
    "KEY_NOT_FOUND": NotFoundError,
    "POOL_EXISTS": ConflictError,
    "SESSION_CLOSED": ConflictError,
    "PROCESS_NOT_RUNNING": ConflictError,
    "SANDBOX_NOT_RUNNING": ConflictError,
    "SANDBOX_NOT_MIGRATABLE": ConflictError,
    "PATH_CONFLICT": ConflictError,
    "EDGE_NOT_EMPTY": ConflictError,
    "PROJECT_EXISTS": ConflictError,
    "IMAGE_NAME_TAKEN": ConflictError,
    "VOLUME_EXISTS": ConflictError,
    "VOLUME_IN_USE": ConflictError,
    "CAPACITY_EXCEEDED": CapacityError,
    "NODE_MEMORY_PRESSURE": CapacityError,
    "OUTPUT_BUDGET_EXCEEDED": CapacityError,
    "EDGE_UNAVAILABLE": UnavailableError,
    "SANDBOX_MIGRATING": UnavailableError,
    "REGISTRY_UNAVAILABLE": UnavailableError,
    "PORT_NOT_LISTENING": ServerError,
    "PORT_BAD_RESPONSE": ServerError,
    "PORT_WAIT_TIMEOUT": TimeoutError,
    "NODE_DISK_FULL": ServerError,
    "RESULT_TOO_LARGE": ServerError,
    "SANDBOX_CREATE_FAILED": ServerError,
    "SANDBOX_KILL_FAILED": ServerError,
    "SANDBOX_MIGRATE_FAILED": ServerError,
    "EXEC_FAILED": ServerError,
    "INTERNAL": ServerError,
}

_STATUS_CLASSES: Dict[int, Type[DsecError]] = {
    400: InvalidRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequestError,
    415: InvalidRequestError,
    416: InvalidRequestError,
    429: RateLimitError,
    503: CapacityError,
}


def error_from_wire(status: Optional[int], body: Any) -> DsecError:
    """Maps a wire error (``{"code","message","details"}`` or anything else) to an exception.

    The code decides the class; an unknown code (or a body that is not a wire error) falls back
    to the HTTP status, so a proxy's 503 is still a retryable ``CapacityError``.
    """
    err = body if isinstance(body, dict) else {}
    code = err.get("code") if isinstance(err.get("code"), str) else None
    message = err.get("message") if isinstance(err.get("message"), str) else None
    details = err.get("details") if isinstance(err.get("details"), dict) else {}
    cls = CODE_CLASSES.get(code or "")
    if cls is None:
        cls = _STATUS_CLASSES.get(status or 0, ServerError if (status or 0) >= 500 else DsecError)
    return cls(message or f"HTTP {status}", code or f"HTTP_{status}", status, details)
