"""The generated protobuf / gRPC stubs (wsync.v1, generated at build time).

The message modules need only protobuf; the *_grpc service modules (which
import grpc) load on first use, so wsync.layouts works without grpcio.
"""
import importlib

try:
    from wsync.v1 import controller_pb2, layout_pb2, worker_local_pb2  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "wsync's generated stubs (wsync.v1) are missing: install the package with "
        "`pip install --no-build-isolation ./python`, or build the C++ tree and put "
        "build/python on PYTHONPATH (see python/README.md)") from e

_GRPC = ("controller_pb2_grpc", "worker_local_pb2_grpc")


def __getattr__(name):
    if name in _GRPC:
        return importlib.import_module(f"wsync.v1.{name}")
    raise AttributeError(name)
