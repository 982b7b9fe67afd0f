"""The proof's trainers: a transformers model under FSDP2 fully_shard with
AdamW (GPUs), or, where torch < 2.6 / no transformers / host tensors, the
tests' DTensor stand-in over the same HF tensors. Both give:

    describe_items()  (name, DTensor) pairs for wsync.layouts.describe
    register_items()  what wsync.torch.register gets
    step(version)     one training step, in place
    full_tensors()    {HF name (separate experts): full fp32 tensor on the host}
"""
import torch
import torch.distributed as dist

import proof_models


def make(cfg, device, rank, world, prefer_real=True, fused_experts=False, mesh=None,
         tp_mesh=None, group=None):
    """`mesh`: the FSDP2 mesh (default: all `world` ranks); `tp_mesh`: also
    tensor-parallel over it (parallelize_module, Llama only), FSDP2 on top.
    `group`: the stand-in's process group of the `world` trainer ranks
    (default: the default group, which must then hold only them)."""
    if prefer_real and device.type == "cuda":
        return FsdpTrainer(cfg, device, world, mesh=mesh, tp_mesh=tp_mesh)
    return StandInTrainer(cfg, rank, world, fused_experts, group=group)


# Megatron-style TP of a transformers Llama decoder layer.
def _llama_tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}


def _hf_model(cfg):
    import transformers
    kwargs = {k: v for k, v in cfg.items()
              if k not in ("model_type", "architectures", "torch_dtype", "trainer_dtype")}
    if cfg["model_type"] == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs))
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**kwargs))


class FsdpTrainer:
    def __init__(self, cfg, device, world, mesh=None, tp_mesh=None):
        import transformers
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module
        self.cfg, self.device = cfg, device
        torch.manual_seed(0)
        # fp32 master weights, or bf16 ("trainer_dtype") where fp32 + AdamW
        # would not fit beside the receivers (Llama-3-8B on 2 GPUs).
        dtype = torch.bfloat16 if cfg.get("trainer_dtype") == "bfloat16" else torch.float32
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built in that dtype: no fp32 copy on the host
        try:
            model = _hf_model(cfg).to(dtype)
        finally:
            torch.set_default_dtype(default)
        # Every parameter from one seeded generator, identical on every rank
        # (transformers may leave some, e.g. fused experts, to lazy init).
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        if hasattr(model, "set_experts_implementation"):  # transformers >= 5
            model.set_experts_implementation("eager")
        model = model.to(device)
        mesh = mesh if mesh is not None else init_device_mesh(device.type, (world,))
        if tp_mesh is not None:
            if cfg["model_type"] != "llama":
                raise ValueError("the proof's TP plan is for Llama-shaped models")
            for layer in model.model.layers:
                parallelize_module(layer, tp_mesh, _llama_tp_plan())
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        names = [n for n, _ in model.named_parameters()]
        self.fused_experts = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
        tp = f"tp{tp_mesh.size()}x" if tp_mesh is not None else ""
        self.kind = f"{tp}fsdp2({mesh.size()})+transformers-{transformers.__version__}"

    def describe_items(self):
        return list(self.model.named_parameters())

    def register_items(self):
        return self.describe_items()

    def step(self, version):
        g = torch.Generator(device="cpu").manual_seed(version)
        ids = torch.randint(0, self.cfg["vocab_size"], (4, 64), generator=g).to(self.device)
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_bytes(self):
        """Bytes of full_tensors()."""
        return sum(p.numel() * (2 if p.dtype == torch.bfloat16 else 4)
                   for p in self.model.parameters())

    def full_tensors(self, on_device=False):
        # bf16 stays bf16 (exact; the receivers hold bf16): half the memory.
        # on_device: kept on this rank's GPU (the checks then run there, tens
        # of times faster than on the host at Llama-3-8B's size).
        full = {n: p.full_tensor().detach() for n, p in self.model.named_parameters()}
        if not on_device:
            full = {n: t.cpu() for n, t in full.items()}
        full = {n: t if t.dtype == torch.bfloat16 else t.float() for n, t in full.items()}
        return proof_models.unfuse_experts(self.cfg, full) if self.fused_experts else full


class StandInTrainer:
    """HF tensors (fp32) sharded on dim 0 by torch.chunk's rule over `world`
    ranks; each step adds seeded noise to the local shards in place. With
    `fused_experts`, MoE experts are held as transformers >= 5 holds them
    (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I])."""

    def __init__(self, cfg, rank, world, fused_experts=False, group=None):
        import ducks
        self.cfg, self.rank, self.world, self.group = cfg, rank, world, group
        g = torch.Generator().manual_seed(0)
        full = {n: torch.randn(*s, generator=g) for n, s in proof_models.hf_shapes(cfg).items()}
        self.fused_experts = fused_experts and cfg["model_type"] == "qwen3_moe"
        if self.fused_experts:
            full = proof_models.fuse_experts(cfg, full)
        self.params = {n: ducks.DTensor(t, list(range(world)), [ducks.Shard(0)], rank)
                       for n, t in full.items()}
        self.locals = {n: p.to_local() for n, p in self.params.items()}
        self.kind = "dtensor-stand-in" + ("-fused-experts" if self.fused_experts else "")

    def describe_items(self):
        return list(self.params.items())

    def register_items(self):
        return self.locals

    def step(self, version):
        g = torch.Generator().manual_seed(1000 * version + self.rank)
        with torch.no_grad():
            for t in self.locals.values():
                t.add_(torch.randn(t.shape, generator=g), alpha=0.01)

    def full_bytes(self):
        return sum(t.numel() * 4 for t in self.locals.values()) * self.world

    def full_tensors(self, on_device=False):
        del on_device  # the stand-in's tensors live on the host
        shards = [None] * self.world
        dist.all_gather_object(shards, {n: t.clone() for n, t in self.locals.items()},
                               group=self.group)
        full = {n: torch.cat([s[n] for s in shards]) for n in self.locals}
        return proof_models.unfuse_experts(self.cfg, full) if self.fused_experts else full
