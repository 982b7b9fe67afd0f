"""wsync: weight synchronization from RL trainers into inference servers.

The trainer side talks to the controller (``wsync.Client``, ``wsync.aio.Client``),
derives the TransferSpec from its model (``wsync.layouts``, ``wsync.vllm``) and
registers its tensors with the local worker (``wsync.torch.register``).
"""
import pkgutil as _pkgutil

# The generated stubs (wsync.v1) and the extension (wsync._native) live in the
# build tree when running from a source checkout: let every ``wsync`` directory
# on sys.path contribute to this package.
__path__ = _pkgutil.extend_path(__path__, __name__)

from wsync.errors import (  # noqa: E402
    WsyncError, InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unavailable,
    DeadlineExceeded, Aborted, Cancelled, ResourceExhausted, Internal, SyncFailed, SyncCancelled)
from wsync.client import Client, SyncHandle  # noqa: E402

__all__ = [
    "Client", "SyncHandle", "WsyncError", "InvalidArgument", "NotFound", "AlreadyExists",
    "FailedPrecondition", "Unavailable", "DeadlineExceeded", "Aborted", "Cancelled",
    "ResourceExhausted", "Internal", "SyncFailed", "SyncCancelled",
]
