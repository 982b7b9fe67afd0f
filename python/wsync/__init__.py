"""wsync: weight synchronization from RL trainers into inference servers.

The trainer side talks to the controller (``wsync.Client``, ``wsync.aio.Client``),
derives the TransferSpec from its model (``wsync.layouts``, ``wsync.vllm``) and
registers its tensors with the local worker (``wsync.torch.register``).
The client and the errors load on first use (they need grpcio); the layout
modules need only protobuf.
"""
import importlib as _importlib
import pkgutil as _pkgutil

# The generated stubs (wsync.v1) and the extension (wsync._native) live in the
# build tree when running from a source checkout: let every ``wsync`` directory
# on sys.path contribute to this package.
__path__ = _pkgutil.extend_path(__path__, __name__)

_ERRORS = ("WsyncError", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition",
           "Unavailable", "DeadlineExceeded", "Aborted", "Cancelled", "ResourceExhausted",
           "Internal", "Unauthenticated", "PermissionDenied", "SyncFailed", "SyncCancelled")
__all__ = ["Client", "SyncHandle", "Tls", *_ERRORS]


def __getattr__(name):
    if name == "Tls":
        return getattr(_importlib.import_module("wsync._channel"), name)
    if name in ("Client", "SyncHandle"):
        return getattr(_importlib.import_module("wsync.client"), name)
    if name in _ERRORS:
        return getattr(_importlib.import_module("wsync.errors"), name)
    raise AttributeError(f"module 'wsync' has no attribute {name!r}")
