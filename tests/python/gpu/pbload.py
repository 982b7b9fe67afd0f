"""wsync.v1's message modules built from the committed FileDescriptorSet
(fixtures/wsync_v1.fds, `protoc --include_imports --descriptor_set_out` of
proto/wsync/v1/*.proto), not from protoc's generated code.

Why: Debian's protoc is 3.21 and the GPU machine runs protobuf 7.x. Gencode
of 3.21 calls no runtime version check (that arrived with 5.26's
`runtime_version.ValidateProtobufRuntimeVersion`), but it relies on builder
internals (`_builder.BuildTopDescriptorsAndMessages`,
`_descriptor._USE_C_DESCRIPTORS`) that a newer runtime is free to change.
Descriptors from serialized FileDescriptorProtos and message classes from
the pool are the runtime's stable public API in every release (3.21:
MessageFactory.GetPrototype; >= 4.22: message_factory.GetMessageClass), so
the proof loads its messages that way, here and on the GPU machine alike.
The *_pb2_grpc modules (plain Python over grpc) are used as generated: they
import the message modules by name, which resolve to the modules made here.

    import pbload; pbload.install()   # before importing wsync
"""
import os
import sys
import types

FDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "wsync_v1.fds")
MODULES = {"wsync/v1/layout.proto": "layout_pb2", "wsync/v1/plan.proto": "plan_pb2",
           "wsync/v1/controller.proto": "controller_pb2",
           "wsync/v1/worker_local.proto": "worker_local_pb2",
           "wsync/v1/lane.proto": "lane_pb2"}


def _message_class(pool, desc):
    from google.protobuf import message_factory
    get = getattr(message_factory, "GetMessageClass", None)
    if get is not None:
        return get(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


class _EnumWrapper:
    """Name() / Value() / values() of an enum descriptor, should the
    runtime's internal EnumTypeWrapper ever move."""

    def __init__(self, desc):
        self.DESCRIPTOR = desc

    def Name(self, number):
        return self.DESCRIPTOR.values_by_number[number].name

    def Value(self, name):
        return self.DESCRIPTOR.values_by_name[name].number

    def keys(self):
        return [v.name for v in self.DESCRIPTOR.values]

    def values(self):
        return [v.number for v in self.DESCRIPTOR.values]

    def items(self):
        return [(v.name, v.number) for v in self.DESCRIPTOR.values]


def _enum_wrapper(desc):
    try:
        from google.protobuf.internal import enum_type_wrapper
        return enum_type_wrapper.EnumTypeWrapper(desc)
    except ImportError:
        return _EnumWrapper(desc)


def _module(pool, file_desc, modname):
    mod = types.ModuleType(f"wsync.v1.{modname}")
    mod.DESCRIPTOR = file_desc
    for name, enum in file_desc.enum_types_by_name.items():
        setattr(mod, name, _enum_wrapper(enum))
        for v in enum.values:
            setattr(mod, v.name, v.number)
    for name, msg in file_desc.message_types_by_name.items():
        setattr(mod, name, _message_class(pool, msg))
    return mod


def install(path=FDS):
    """Puts wsync.v1.<name>_pb2 (messages from the descriptor set) into
    sys.modules; returns the protobuf runtime's version."""
    import google.protobuf
    from google.protobuf import descriptor_pb2, descriptor_pool
    fds = descriptor_pb2.FileDescriptorSet.FromString(open(path, "rb").read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    if "wsync" in sys.modules:
        raise RuntimeError("pbload.install() must run before wsync is imported")
    # Entries in sys.modules win over the generated files when wsync imports
    # `from wsync.v1 import controller_pb2`.
    for f in fds.file:
        if f.name in MODULES:
            mod = _module(pool, pool.FindFileByName(f.name), MODULES[f.name])
            sys.modules[mod.__name__] = mod
    return google.protobuf.__version__
