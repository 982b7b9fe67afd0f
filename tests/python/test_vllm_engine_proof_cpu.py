"""The GPU proof of issue 17 (tests/python/gpu/vllm_engine_proof.py) on the
host: the same script with gloo, host workers and plain host memory, the tiny
configs and the DTensor stand-in trainer (torch 1.13 has no FSDP2), its
receivers separate spawned processes running wsync's vLLM engine with the
embedded worker, driven by the calls of vLLM's gpu_worker.py. Both
placements, each ending with the killed-trainer case, so that the GPU run is
unlikely to fail on anything but the GPU parts."""
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gpu"))

from proof_models import CONFIGS  # noqa: E402

SCRIPT = os.path.join(HERE, "gpu", "vllm_engine_proof.py")
VERSIONS = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_proof(tmp_path, world, *flags, expect_rc=0):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WSYNC_PROOF_INIT_FILE=str(tmp_path / f"rendezvous-{time.monotonic_ns()}"),
               WORLD_SIZE=str(world))
    out = tmp_path / "out"
    procs = []
    for r in range(world):
        log = open(tmp_path / f"rank{r}.log", "w")
        procs.append((subprocess.Popen(
            [sys.executable, SCRIPT, "--cpu", "--versions", str(VERSIONS), "--timeout", "60",
             "--kill-timeout", "20", "--round-timeout", "5", "--run-dir", str(tmp_path),
             "--out", str(out), *flags],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log,
            stderr=subprocess.STDOUT), log))
    rcs = []
    for p, log in procs:
        try:
            rcs.append(p.wait(timeout=200))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
        log.close()
    logs = "\n".join(open(tmp_path / f"rank{r}.log").read()[-3000:] for r in range(world))
    assert rcs == [expect_rc] * world, logs
    return [json.loads(line) for line in open(out / "vllm_proof.jsonl")], logs


def check_records(recs, placement, models=("llama", "qwen3_moe"), killed=True):
    kill = VERSIONS + 1
    want = [(m, v) for m in models for v in range(1, VERSIONS + 1)]
    assert [(r["model"], r["version"]) for r in recs] == want + [(models[-1], kill)] * killed
    for r in recs:
        assert r["bit_exact"] and not r["mismatches"], r
        assert r["placement"] == placement and r["memory"] == "host" and r["device"] == "cpu"
        assert r["export_refused"] == [None, None], r  # host memory: nothing to refuse
    for r in recs[:len(want)]:
        assert r["bytes"] > 0 and r["sync_wait_s"] > 0, r
        assert r["weight_versions"] == [r["version"]] * 2, r
        assert len(r["start_to_finish_s"]) == 2 and min(r["start_to_finish_s"]) > 0, r
    if not killed:
        return
    last = recs[-1]
    assert last["case"] == "killed trainer sidecar" and last["kept_version"] == VERSIONS
    assert len(last["update_errors"]) == 2, last
    assert all(f"version {kill}" in e for e in last["update_errors"]), last
    assert last["sync_error"], last
    # Each rank: finish refused (vLLM's worker left the update), and where the
    # engine reports the weights mixed, a new window's finish refuses too.
    assert len(last["mixed_reported"]) == 2, last
    assert sum("without a matching start" in f for f in last["finish_refusals"]) == 2, last
    for mixed in filter(None, last["mixed_reported"]):
        assert mixed["version"] == kill, last
        assert any(f.startswith("FailedPrecondition") and f"version {kill}" in f
                   for f in last["finish_refusals"]), last


def test_colocated_on_the_host(tmp_path):
    """The trainer ranks register with the vLLM ranks' workers (no sidecar):
    no kill case, a dead trainer process fails no sync there."""
    recs, logs = run_proof(tmp_path, 2, "--placement", "colocated")
    check_records(recs, "colocated", killed=False)
    assert "VLLM PROOF PASSED" in logs


def test_disjoint_on_the_host(tmp_path):
    recs, _ = run_proof(tmp_path, 4, "--placement", "disjoint", "--models", "qwen3_moe")
    check_records(recs, "disjoint", models=("qwen3_moe",))


def test_fused_experts_and_a_stray_write_on_the_host(tmp_path):
    """transformers >= 5 holds Qwen3-MoE experts fused: the receivers derive the
    stacked naming and the script rewrites the mappings, as sync_proof does
    (version 2 bit for bit). And the proof's comparison can fail: a write into
    one receiver parameter after version 1 is reported by name, exit status 1."""
    recs, logs = run_proof(tmp_path, 2, "--models", "qwen3_moe", "--fused-experts",
                           "--no-kill", "--corrupt-after", "1", expect_rc=1)
    assert [(r["version"], r["bit_exact"]) for r in recs] == [(1, False), (2, True)]
    assert recs[0]["mismatches"] == [
        "rank 0: model.norm.weight: 1 of %d elements differ"
        % CONFIGS[("qwen3_moe", "tiny")]["hidden_size"]], recs[0]
    assert "VLLM PROOF FAILED" in logs
