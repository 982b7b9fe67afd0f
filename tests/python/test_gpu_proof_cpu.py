"""The GPU proof script (tests/python/gpu/sync_proof.py) on the host: the
same script with gloo, host workers and shared memory, tiny configs and the
DTensor stand-in trainer (torch 1.13 has no FSDP2), so the GPU run is
unlikely to fail on anything but the GPU parts. Also: the committed
destination fixtures are what wsync.vllm builds today, and the descriptor-set
stubs (pbload) load."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = os.path.join(HERE, "gpu")
sys.path.insert(0, GPU)

import make_fixtures  # noqa: E402
from proof_models import fixture_name  # noqa: E402


@pytest.mark.parametrize("model,size,experts", list(make_fixtures.variants()))
def test_destination_fixtures_are_current(model, size, experts):
    path = os.path.join(GPU, "fixtures", fixture_name(model, size, experts))
    assert open(path).read() == make_fixtures.spec_json(model, size, experts), (
        f"{path} is stale: run tests/python/gpu/make_fixtures.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_proof(tmp_path, *flags):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WSYNC_PROOF_INIT_FILE=str(tmp_path / f"rendezvous-{time.monotonic_ns()}"),
               WORLD_SIZE="2")
    out = tmp_path / "out"
    procs = []
    for r in range(2):
        log = open(tmp_path / f"rank{r}.log", "w")
        procs.append((subprocess.Popen(
            [sys.executable, os.path.join(GPU, "sync_proof.py"), "--tiny", "--versions", "2",
             "--run-dir", str(tmp_path), "--out", str(out), *flags],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log,
            stderr=subprocess.STDOUT), log))
    rcs = []
    for p, log in procs:
        try:
            rcs.append(p.wait(timeout=180))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
        log.close()
    logs = "\n".join(open(tmp_path / f"rank{r}.log").read()[-3000:] for r in range(2))
    assert rcs == [0, 0], logs
    return [json.loads(line) for line in open(out / "proof0.jsonl")]


def check_records(recs, models, kind):
    assert [(r["model"], r["version"]) for r in recs] == [(m, v) for m in models
                                                            for v in (1, 2)]
    for r in recs:
        assert r["bit_exact"] and not r["mismatches"], r
        assert r["trainer"] == kind and r["bytes"] > 0
        assert 0 < r["sync_wait_s"] <= r["step_to_synced_s"]


def test_proof_script_on_the_host(tmp_path):
    check_records(run_proof(tmp_path), ["llama", "qwen3_moe"], "dtensor-stand-in")


def test_proof_script_fused_experts_on_the_host(tmp_path):
    """transformers >= 5 holds Qwen3-MoE experts fused (gate_up_proj): the
    script's rewritten mappings and its unfused reference agree."""
    check_records(run_proof(tmp_path, "--models", "qwen3_moe", "--fused-experts"),
                  ["qwen3_moe"], "dtensor-stand-in-fused-experts")
