"""Exceptions for server errors: one class per gRPC status code, all WsyncError.

Every error carries the server's message; a failed sync (SyncFailed) also
carries the first cause the controller recorded: the failed group and rank,
worker id, round and peer (-1 where unknown) and the whole SyncStatus.
"""
import grpc


class WsyncError(Exception):
    """A wsync call failed. ``code`` is the grpc.StatusCode, ``message`` the
    server's text, ``group`` / ``rank`` the failed member where known."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, *, code=None, group="", rank=-1, status=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.group = group
        self.rank = rank
        self.status = status

    def __str__(self):
        where = f" [{self.group}/{self.rank}]" if self.group else ""
        return f"{self.code.name}{where}: {self.message}"


class InvalidArgument(WsyncError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(WsyncError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(WsyncError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(WsyncError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(WsyncError):
    """The controller (or the worker's socket) cannot be reached."""
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(WsyncError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(WsyncError):
    code = grpc.StatusCode.ABORTED


class Cancelled(WsyncError):
    code = grpc.StatusCode.CANCELLED


class ResourceExhausted(WsyncError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Internal(WsyncError):
    code = grpc.StatusCode.INTERNAL


class Unauthenticated(WsyncError):
    """No (or an unknown) token or client certificate (docs/security.md)."""
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(WsyncError):
    """The caller's role or identity may not do this (docs/security.md)."""
    code = grpc.StatusCode.PERMISSION_DENIED


class SyncFailed(WsyncError):
    """A sync ended SYNC_FAILED. ``code`` is the first cause's status code;
    ``worker``, ``round``, ``peer`` locate it (-1: unknown)."""

    def __init__(self, status):
        code = _code_from_int(status.error_code)
        super().__init__(status.error or "sync failed", code=code, group=status.failed_group,
                         rank=status.failed_rank if status.failed_group else -1, status=status)
        self.worker = status.failed_worker
        self.round = status.failed_round
        self.peer = status.failed_peer


class SyncCancelled(WsyncError):
    code = grpc.StatusCode.CANCELLED

    def __init__(self, status):
        super().__init__(status.error or "sync cancelled", status=status)


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unavailable, DeadlineExceeded,
    Aborted, Cancelled, ResourceExhausted, Internal, Unauthenticated, PermissionDenied)}

def _code_from_int(value):
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


def _parse_member(message):
    """The first 'group/rank' the message names, as ("group", rank), else ("", -1).

    The controller names workers as ``<group>/<rank>`` (docs/api.md)."""
    import re
    # Only where the controller names a worker: "worker G/R", or "G/R:" opening
    # the message or a parenthesis (rendezvous keys and buffer names also hold
    # slashes and digits).
    m = re.search(r"(?:\bworker |^|\()([A-Za-z][A-Za-z0-9_.-]*)/(\d+)(?=[ :)]|$)", message)
    if m:
        return m.group(1), int(m.group(2))
    # "group 'G' rank R": a rank that is not (or no longer) registered.
    m = re.search(r"\bgroup '([^']+)' rank (\d+)\b", message)
    if m:
        return m.group(1), int(m.group(2))
    return "", -1


def from_rpc_error(err, what=""):
    """A WsyncError subclass instance for a grpc.RpcError (sync or aio)."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    return from_status(code, details, what)


def from_status(code, details, what=""):
    """A WsyncError subclass instance for a failed call's status: `code` a
    grpc.StatusCode or its integer value, `details` the server's message."""
    if not isinstance(code, grpc.StatusCode):
        code = _code_from_int(code)
    details = details or ""
    if code == grpc.StatusCode.UNAVAILABLE and what:
        details = f"{what}: {details}"
    group, rank = _parse_member(details) if code != grpc.StatusCode.UNAVAILABLE else ("", -1)
    cls = _BY_CODE.get(code, WsyncError)
    return cls(details, code=code, group=group, rank=rank)
