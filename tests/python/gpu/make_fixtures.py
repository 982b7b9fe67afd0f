"""Writes the proof's destination specs (wsync.vllm.destination: vLLM TP=2
parameters and the mappings from HF names) to fixtures/*.json, for the GPU
machine, whose Python (3.12) cannot load wsync._native (built for Debian's
3.11). tests/python/test_gpu_proof_cpu.py checks they are current.

    PYTHONPATH=python:build/python /usr/bin/python3 tests/python/gpu/make_fixtures.py
"""
import os
import sys

from google.protobuf import json_format

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from proof_models import CONFIGS, TP, fixture_name  # noqa: E402


def variants():
    for (model, size) in CONFIGS:
        for experts in (("separate", "stacked") if model == "qwen3_moe" else ("separate",)):
            yield model, size, experts


def spec_json(model, size, experts):
    from wsync import vllm
    spec = vllm.destination(CONFIGS[(model, size)], tp=TP, experts=experts)
    return json_format.MessageToJson(spec, indent=None, sort_keys=True) + "\n"


def main():
    for model, size, experts in variants():
        path = os.path.join(HERE, "fixtures", fixture_name(model, size, experts))
        with open(path, "w") as f:
            f.write(spec_json(model, size, experts))
        print(path, os.path.getsize(path))


if __name__ == "__main__":
    main()
