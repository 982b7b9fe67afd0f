"""TransferSpec values: accepted as protobuf messages, proto3-JSON dicts or JSON text."""
import json

from google.protobuf import json_format

from wsync._proto import layout_pb2


def to_proto(spec):
    """A wsync.v1.TransferSpec from a TransferSpec, a dict (proto3 JSON form,
    docs/layout-spec.md), JSON text or an object with a ``to_proto()`` method."""
    if isinstance(spec, layout_pb2.TransferSpec):
        return spec
    if hasattr(spec, "to_proto"):
        return spec.to_proto()
    if isinstance(spec, (str, bytes)):
        spec = json.loads(spec)
    if isinstance(spec, dict):
        return json_format.ParseDict(spec, layout_pb2.TransferSpec())
    raise TypeError(f"cannot make a TransferSpec from {type(spec).__name__}")


def to_dict(spec):
    """The proto3 JSON form (lowerCamelCase names) of a spec."""
    return json_format.MessageToDict(to_proto(spec))
