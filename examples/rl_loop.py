"""A minimal RL-style loop with wsync, runnable on one CPU machine:

    train step -> sync the new weights into the inference group -> generate

The trainer is one rank holding a tiny Llama (HF parameter names); the
"inference engine" is 2 tensor-parallel ranks holding vLLM's layout (fused
qkv_proj / gate_up_proj, padded vocab). wsync's controller and 3 workers run
as processes of the C++ build. In a real job each trainer rank runs
``python -m wsync.worker --group trainer`` beside it and calls
``wsync.torch.register(model, ...)``; rank 0 defines the transfer and syncs.

    PYTHONPATH=python:build/python /usr/bin/python3 examples/rl_loop.py --steps 3
"""
import argparse
import os
import subprocess
import tempfile
import time

import torch

import wsync
import wsync.torch
from wsync import layouts, vllm

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
          "vocab_size": 100, "torch_dtype": "float32"}


def tiny_llama(c):
    """A module tree with Hugging Face's LlamaForCausalLM parameter names."""
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = h // c["num_attention_heads"]
    lin = lambda o, n: torch.nn.Linear(n, o, bias=False)  # noqa: E731
    layers = torch.nn.ModuleList()
    for _ in range(c["num_hidden_layers"]):
        attn = torch.nn.Module()
        attn.q_proj, attn.o_proj = lin(h, h), lin(h, h)
        attn.k_proj = lin(c["num_key_value_heads"] * hd, h)
        attn.v_proj = lin(c["num_key_value_heads"] * hd, h)
        mlp = torch.nn.Module()
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = lin(i, h), lin(i, h), lin(h, i)
        layer = torch.nn.Module()
        layer.self_attn, layer.mlp = attn, mlp
        layer.input_layernorm, layer.post_attention_layernorm = _Norm(h), _Norm(h)
        layers.append(layer)
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.embed_tokens = torch.nn.Embedding(c["vocab_size"], h)
    root.model.layers, root.model.norm = layers, _Norm(h)
    root.lm_head = lin(c["vocab_size"], h)
    return root


class _Norm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))


def start_wsync(build, tmp):
    """wsync-controller and one worker per rank; returns (address, sockets, procs)."""
    def run(args, name):
        return subprocess.Popen(args, stdout=open(os.path.join(tmp, name + ".log"), "wb"),
                                stderr=subprocess.STDOUT)

    def wait_for(path, key):
        for _ in range(500):
            if os.path.exists(path):
                for line in open(path).read().split():
                    if line.startswith(key + "="):
                        return line.split("=", 1)[1]
            time.sleep(0.02)
        raise TimeoutError(f"{path}: no {key}")

    procs = [run([f"{build}/controller/server/wsync-controller", "--listen=127.0.0.1:0",
                  "--insecure", "--metrics_port=-1", f"--port_file={tmp}/c.ports",
                  f"--state_file={tmp}/controller.state"], "controller")]
    address = "127.0.0.1:" + wait_for(f"{tmp}/c.ports", "grpc_port")
    sockets = {}
    for group, rank, size in (("trainer", 0, 1), ("inference", 0, 2), ("inference", 1, 2)):
        name = f"{group}-{rank}"
        procs.append(run([f"{build}/worker/agent/wsync-worker", f"--controller={address}",
                          "--insecure", f"--groups={group}:{rank}:{size}", f"--local_socket={tmp}/{name}.sock",
                          "--metrics_port=-1", f"--port_file={tmp}/{name}.ports"], name))
        sockets[(group, rank)] = wait_for(f"{tmp}/{name}.ports", "local_socket")
    return address, sockets, procs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--build", default=os.environ.get("WSYNC_BUILD_DIR", "build"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="wsync-example-")
    address, sockets, procs = start_wsync(os.path.abspath(args.build), tmp)
    try:
        torch.manual_seed(0)
        model = tiny_llama(CONFIG)
        # Trainer rank 0: its tensors go to shared memory its worker maps.
        wsync.torch.register(model, group="trainer", rank=0, socket=sockets[("trainer", 0)])
        # The spec: the trainer's layout from the model, vLLM's from the HF config.
        spec = layouts.transfer_spec(layouts.source_side(layouts.describe(model, rank=0)),
                                     vllm.destination(CONFIG, tp=2), name="tiny-llama")
        # Inference ranks (stand-in for vLLM): buffers in vLLM's layout.
        engines = []
        for r in range(2):
            bufs = {b: torch.zeros(n) for b, (_, n) in
                    layouts.local_buffers(spec.destination, r).items()}
            engines.append(wsync.torch.register(bufs, group="inference", rank=r,
                                                socket=sockets[("inference", r)]))
        client = wsync.Client(address)
        client.wait_for_workers({"trainer": 1, "inference": 2}, timeout=30, buffers=True)
        client.define_transfer("policy", spec)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1, args.steps + 1):
            loss = sum((p.float() ** 2).mean() for p in model.parameters())  # "train step"
            opt.zero_grad()
            loss.backward()
            opt.step()
            t0 = time.perf_counter()
            client.sync(step).wait(timeout=60)                                 # "sync"
            ms = 1000 * (time.perf_counter() - t0)
            # "generate": rank 1's fused qkv holds its q heads then its k and v heads.
            attn = model.model.layers[0].self_attn
            qkv = engines[1].tensors["model.layers.0.self_attn.qkv_proj.weight"].view(-1, 64)
            want = torch.cat([attn.q_proj.weight[32:], attn.k_proj.weight[8:],
                              attn.v_proj.weight[8:]])
            assert torch.equal(qkv, want), "inference rank 1 holds other weights"
            print(f"step {step}: loss {loss.item():.4f}, synced in {ms:.1f} ms, "
                  "inference weights match")
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
