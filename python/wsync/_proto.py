"""The generated gRPC / protobuf stubs (wsync.v1, generated at build time)."""
try:
    from wsync.v1 import controller_pb2, controller_pb2_grpc, layout_pb2  # noqa: F401
    from wsync.v1 import worker_local_pb2, worker_local_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "wsync's generated stubs (wsync.v1) are missing: install the package with "
        "`pip install --no-build-isolation ./python`, or build the C++ tree and put "
        "build/python on PYTHONPATH (see python/README.md)") from e
