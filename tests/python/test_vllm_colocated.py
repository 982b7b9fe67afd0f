"""Trainer ranks colocated with vLLM ranks, no sidecar (init_info
``colocated``): each vLLM rank's embedded worker also holds the trainer rank
of its device and serves the local API, where that trainer registers its
FSDP2-style shards. One worker then holds both sides of its device and copies
locally; only the pieces that cross devices travel (on GPUs NCCL refuses two
ranks of one device in a communicator, and sleep-mode weights cannot be
mapped by another process). On CPU with the host transport: every version
bit for bit, the registration path, and the refusals of bad options."""
import pytest

import wsync
import wsync.torch
from wsync import errors, layouts, vllm
from wsync.vllm_receiver import colocation

import ducks
from vllm_engine_setup import Setup, engine_mod, setups  # noqa: F401
from vllm_standins import RECORDER, TINY

TRAINERS = 2


def fsdp_params(full, rank):
    return {n: ducks.DTensor(t, list(range(TRAINERS)), [ducks.Shard(0)], rank)
            for n, t in full.items()}


class ColocatedSetup(Setup):
    """Setup whose trainer ranks register with the vLLM ranks' workers."""

    def __init__(self, cluster, tmp_path, **kw):
        self.socket = str(tmp_path / "colo-{rank}.sock")
        init = {"colocated": {"group": "trainer", "size": TRAINERS, "socket": self.socket}}
        super().__init__(cluster, cfg=TINY, builder=RECORDER.llama, tp=2, ep=False, init=init,
                         **kw)

    def start_trainer(self):
        self.reg = None  # the ranks register once the vLLM ranks' workers serve

    def define(self):
        self.params = {r: fsdp_params(self.full, r) for r in range(TRAINERS)}
        self.regs = [wsync.torch.register({n: p.to_local() for n, p in self.params[r].items()},
                                          group="trainer", rank=r,
                                          socket=self.socket.format(rank=r))
                     for r in range(TRAINERS)]
        self.client.wait_for_workers({"trainer": TRAINERS, "inference": self.tp}, timeout=30,
                                     buffers=True)
        src = layouts.source_side(layouts.describe(self.params[0].items(), rank=0))
        dst = vllm.destination(self.cfg, tp=self.tp, expert_parallel=False, dtype="fp32")
        self.spec = layouts.transfer_spec(src, dst, name="vllm")
        self.client.define_transfer("weights", self.spec, source_group="trainer",
                                    destination_group="inference")

    def step(self, scale, shift):
        for r in range(TRAINERS):
            for p in self.params[r].values():
                p.to_local().mul_(scale).add_(shift)
        super().step(scale, shift)

    def close(self):
        for reg in self.regs:
            reg.close()
        for w in self.workers:
            w.shutdown()
        self.client.close()


def test_trainer_ranks_register_with_the_vllm_ranks_workers(cluster, engine_mod, setups,
                                                            tmp_path):
    s = ColocatedSetup(cluster, tmp_path)
    setups.append(s)
    workers = s.client.workers()
    # Two workers, not four: each holds a trainer rank and a vLLM rank.
    assert len([w for w in workers if w.alive]) == 2
    roles = sorted(sorted(f"{m.group}/{m.rank}" for m in w.memberships)
                   for w in workers if w.alive)
    assert roles == [["inference/0", "trainer/0"], ["inference/1", "trainer/1"]]
    for version in (1, 2, 3):
        if version > 1:
            s.step(-0.5, float(version))
        s.update(version)
        s.check()
        for w in s.workers:
            assert w.engine.weight_version == version and w.engine.status()["mixed"] is None


def test_bad_colocation_options_are_refused_by_name():
    with pytest.raises(errors.InvalidArgument, match="missing \\['size'\\]"):
        colocation({"group": "trainer", "socket": "/x-{rank}"}, 0)
    with pytest.raises(errors.InvalidArgument, match="unknown \\['rank'\\]"):
        colocation({"size": 2, "socket": "/x", "rank": 1}, 0)
    with pytest.raises(errors.InvalidArgument, match="KeyError"):
        colocation({"size": 2, "socket": "/x-{host}"}, 0)
    with pytest.raises(errors.InvalidArgument, match="ValueError"):
        colocation({"size": "two", "socket": "/x"}, 0)
    with pytest.raises(errors.InvalidArgument, match="trainer rank 2 .* outside trainer size 2"):
        colocation({"size": 2, "socket": "/x-{rank}"}, 2)
    with pytest.raises(errors.InvalidArgument, match="name no trainer rank for destination rank 1"):
        colocation({"size": 2, "socket": "/x", "ranks": [1]}, 1)
    assert colocation(None, 3) == ((), None)
    assert colocation({"size": 4, "socket": "/run/c-{rank}.sock", "ranks": [3, 2]}, 1) == \
        (("trainer:2:4",), "/run/c-2.sock")
