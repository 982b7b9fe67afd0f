"""How long does an owner take to point its parameters at another weight set
(a pointer flip instead of a remap)? Llama-3-8B TP2-like (291 tensors) and a
Qwen3-30B-A3B-like count (18,867 tensors), on one GPU, torch's `p.data = view`
and `torch.utils.swap_tensors`; median of 21 flips each."""
import statistics
import time

import torch

def run(n, numel_each):
    arena = [torch.empty(n * numel_each, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    views = [[a[i * numel_each:(i + 1) * numel_each].view(numel_each // 64, 64) for i in range(n)]
             for a in arena]
    params = [torch.nn.Parameter(v.clone()) for v in views[0]]
    for p, v in zip(params, views[0]):
        p.data = v
    times = []
    for k in range(21):
        target = views[(k + 1) % 2]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p, v in zip(params, target):
            p.data = v
        times.append(time.perf_counter() - t0)
    set_times = []
    for k in range(21):
        target = views[(k + 1) % 2]
        t0 = time.perf_counter()
        with torch.no_grad():
            for p, v in zip(params, target):
                p.set_(v)
        set_times.append(time.perf_counter() - t0)
    return statistics.median(times), statistics.median(set_times)

for n in (195, 291, 435, 18867):
    d, s = run(n, 4096)
    print(f"tensors {n}: p.data = view {d*1e3:.3f} ms, p.set_(view) {s*1e3:.3f} ms")
