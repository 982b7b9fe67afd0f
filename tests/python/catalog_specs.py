"""TransferSpecs as the C++ catalog builds them (build/tools/wsyncctl catalog)."""
import json
import subprocess

from google.protobuf import json_format

from wsync._proto import layout_pb2
from harness import WSYNCCTL_BIN


def wsyncctl_spec(*flags):
    out = subprocess.run([WSYNCCTL_BIN, "catalog", *flags], check=True, capture_output=True,
                         timeout=60).stdout
    return json_format.ParseDict(json.loads(out), layout_pb2.TransferSpec())


def tensors_by_name(side):
    return {t.name: t for t in side.tensors}
