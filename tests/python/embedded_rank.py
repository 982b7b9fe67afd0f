"""A child process owning one embedded worker (wsync.embedded.Worker), driven
by its parent over a multiprocessing pipe: each rank runs its own worker in its
own process, as vLLM's TP workers would. `device`: the CUDA device of its
tensors and worker (None: host memory)."""
import threading

import torch


def _encode(t):
    t = t.detach().contiguous().cpu()
    return str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()


def decode(item):
    dtype, shape, raw = item
    dt = getattr(torch, dtype.replace("torch.", ""))
    return torch.frombuffer(bytearray(raw), dtype=dt).reshape(shape).clone()


class _Rank:
    def __init__(self, controller, groups, device=None):
        self.controller, self.groups, self.device = controller, groups, device
        self.worker, self.buffers, self.events = None, {}, []
        self.where = "cpu" if device is None else f"cuda:{device}"

    def start(self):
        from wsync import embedded
        if self.device is not None:
            torch.cuda.set_device(self.device)
        self.worker = embedded.Worker(self.controller, self.groups, device=self.device)
        self.worker.wait_registered(timeout=30)
        sub = self.worker.events()
        threading.Thread(target=self._follow, args=(sub,), daemon=True).start()
        return self.worker.backend

    def _follow(self, sub):
        while self.worker.running:
            ev = sub.next(0.1)
            if ev is not None:
                self.events.append(ev)

    def alloc_register(self, sizes, replace=False, fill=0.0):
        """New zeroed bf16 buffers {name: numel}, registered by pointer."""
        fresh = {n: torch.full((k,), fill, dtype=torch.bfloat16, device=self.where)
                 for n, k in sizes.items()}
        result = self.worker.register(fresh, replace=replace)
        if replace:
            self.buffers = {}
        self.buffers.update(fresh)
        return result

    def register_values(self, encoded):
        """Registers copies of the given tensors {name: _encode(t)} as they are."""
        fresh = {n: decode(v).to(self.where) for n, v in encoded.items()}
        result = self.worker.register(fresh)
        self.buffers.update(fresh)
        return result

    def step(self, scale, shift):
        """An optimizer step in place: every tensor * scale + shift."""
        for t in self.buffers.values():
            t.mul_(scale).add_(shift)
        if self.device is not None:
            torch.cuda.synchronize(self.device)

    def dump(self, names=None):
        return {n: _encode(t) for n, t in self.buffers.items() if names is None or n in names}

    def status(self):
        return self.worker.status()

    def get_events(self):
        return list(self.events)

    def stop(self):
        self.worker.stop()
        return self.worker.running


def encode_all(tensors):
    return {n: _encode(t) for n, t in tensors.items()}


def serve(conn, controller, groups, device=None):
    """Runs commands (method name, args) from `conn` until "exit"; replies
    ("ok", result) or ("error", exception class name, message)."""
    from wsync import errors
    rank = _Rank(controller, groups, device)
    while True:
        cmd, args, kwargs = conn.recv()
        if cmd == "exit":
            if rank.worker is not None:
                rank.worker.stop()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(rank, cmd)(*args, **kwargs)))
        except errors.WsyncError as e:
            conn.send(("error", type(e).__name__, str(e)))
