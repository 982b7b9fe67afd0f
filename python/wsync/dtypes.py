"""Element types: wsync.v1.DType values from torch dtypes or names."""
from wsync._proto import layout_pb2

_NAMES = {"fp32": "FP32", "float32": "FP32", "float": "FP32", "bf16": "BF16",
          "bfloat16": "BF16", "fp16": "FP16", "float16": "FP16", "half": "FP16",
          "fp8_e4m3": "FP8_E4M3", "float8_e4m3fn": "FP8_E4M3", "fp8_e5m2": "FP8_E5M2",
          "float8_e5m2": "FP8_E5M2", "int8": "INT8", "int32": "INT32", "int64": "INT64",
          "uint8": "UINT8", "bool": "BOOL"}
SIZES = {"FP32": 4, "BF16": 2, "FP16": 2, "FP8_E4M3": 1, "FP8_E5M2": 1, "INT8": 1, "INT32": 4,
         "INT64": 8, "UINT8": 1, "BOOL": 1}


def name(dtype):
    """The DType enum name ("BF16") of a torch dtype, a name ("bf16",
    "torch.bfloat16", "BF16") or a DType value."""
    if isinstance(dtype, int):
        return layout_pb2.DType.Name(dtype)
    text = str(dtype)
    if text.startswith("torch."):
        text = text[len("torch."):]
    if text.upper() in SIZES:
        return text.upper()
    if text.lower() in _NAMES:
        return _NAMES[text.lower()]
    raise ValueError(f"unsupported dtype {dtype!r}; wsync moves "
                     + ", ".join(sorted(SIZES)))


def value(dtype):
    """The wsync.v1.DType enum value."""
    return layout_pb2.DType.Value(name(dtype))


def size(dtype):
    return SIZES[name(dtype)]
