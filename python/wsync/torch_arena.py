"""Weight arenas (docs/commit-swap.md): an owner's weights in one remappable
arena of its embedded worker, so that a staged sync commits by swapping the
arena's memory with a twin (no byte copied, every address unchanged) instead
of copying the shadow into the live tensors.

    worker = wsync.embedded.Worker(controller, "inference:0:1", device=...)
    arena, tensors = wsync.torch.pack_into_arena(worker, model)   # after load
    worker.register(model)            # the parameters now live in the arena

The arena's memory is the embedded worker's: a host arena (memfd pages) for
CPU tensors, a CUDA virtual-memory arena (cuMemCreate / cuMemMap) on the
worker's device for CUDA tensors. Views over it (``arena.view``, the tensors
``pack_into_arena`` returns, numpy or torch views of a host arena) keep it
alive and see every committed version at the same address. The owner must
not read the tensors while a commit runs (between the ``commit`` and
``committed`` events), and must not free the arena while it is registered.
"""
import math

import torch

from wsync import errors

# Every tensor starts at a multiple of this (and of its element size): enough
# for any dtype and for vectorised loads.
ALIGN = 256


def _device_index(device):
    """-1 for host memory, else the CUDA device index of `device`."""
    d = torch.device(device)
    if d.type == "cpu":
        return -1
    if d.type != "cuda":
        raise errors.InvalidArgument(f"weight arenas live in host or CUDA memory, not on {d}")
    return d.index if d.index is not None else torch.cuda.current_device()


class _CudaBytes:
    """A CUDA arena's bytes for torch.as_tensor (__cuda_array_interface__)."""

    def __init__(self, native):
        self._native = native  # kept alive by the tensor torch makes over this
        self.__cuda_array_interface__ = {"shape": (native.nbytes,), "typestr": "|u1",
                                         "data": (native.ptr, False), "version": 3,
                                         "strides": None}


class WeightArena:
    """`nbytes` (at least) of remappable memory from `worker` (a
    wsync.embedded.Worker) on `device` (default: the worker's), named `name`
    in errors. ``view`` places tensors in it."""

    def __init__(self, worker, nbytes, device=None, name="", _native=None):
        from wsync.embedded import _call  # wsync.embedded imports this module's parent
        index = worker.device if device is None else _device_index(device)
        self._worker = worker
        self._native = _native if _native is not None else _call(
            worker._w.create_weight_arena, int(nbytes), device=index, name=name)
        self.name = name or f"arena-{self._native.handle}"
        self.device = torch.device("cpu") if index < 0 else torch.device("cuda", index)
        if index < 0:
            self.bytes = torch.frombuffer(self._native, dtype=torch.uint8)
        else:
            self.bytes = torch.as_tensor(_CudaBytes(self._native), device=self.device)

    @property
    def ptr(self):
        return self._native.ptr

    @property
    def nbytes(self):
        return self._native.nbytes

    @property
    def handle(self):
        return self._native.handle

    def view(self, offset, dtype, shape):
        """A tensor of `dtype` and `shape` over the arena's bytes from `offset`."""
        size = torch.empty((), dtype=dtype).element_size()
        n = math.prod(int(d) for d in shape) * size
        if offset < 0 or offset % size or offset + n > self.nbytes:
            raise errors.InvalidArgument(
                f"weight arena {self.name!r}: a {dtype} view of {n} bytes at offset {offset} "
                f"does not fit its {self.nbytes} bytes aligned to {size}")
        return self.bytes[offset:offset + n].view(dtype).view(tuple(shape))

    def free(self):
        """Forgets the arena in the worker (later syncs copy into its
        tensors); its memory lives while views of it do."""
        from wsync.embedded import _call
        _call(self._worker._w.free_weight_arena, self.handle)


def _layout(named):
    """({name: offset}, total bytes): each tensor aligned to ALIGN."""
    offsets, at = {}, 0
    for name, t in named:
        align = max(ALIGN, t.element_size())
        at = (at + align - 1) // align * align
        offsets[name] = at
        at += t.numel() * t.element_size()
    return offsets, max(at, 1)


def _check_one_device(named, device, what):
    first = named[0][1].device if device is None else torch.device(device)
    for n, t in named:
        if _device_index(t.device) != _device_index(first):
            raise errors.InvalidArgument(
                f"{what}: tensor {n!r} is on {t.device}, the arena on {first}: "
                "one arena holds the tensors of one device")
    return first


def pack_into_arena(worker, tensors, device=None, name=""):
    """Moves `tensors` (a module's parameters, {name: tensor} or (name,
    tensor) pairs, all on one device) into one new WeightArena of `worker`:
    each is copied into the arena and, when it has ``.data`` (a Parameter or
    tensor), rebound to its view there (``p.data = view``). Returns (arena,
    {name: view}); register the views (or the module) with `worker`."""
    from wsync.torch import _named
    named = _named(tensors)
    if not named:
        raise errors.InvalidArgument("pack_into_arena: no tensors given")
    first = _check_one_device(named, device, "pack_into_arena")
    offsets, total = _layout(named)
    arena = WeightArena(worker, total, device=first, name=name)
    views = {}
    with torch.no_grad():
        for n, t in named:
            v = arena.view(offsets[n], t.dtype, t.shape)
            v.copy_(t.detach())
            t.data = v
            views[n] = v
    return arena, views


class FlipArenas:
    """An owner's weights in a flip pair of arenas (docs/commit-flip.md),
    made by ``pack_into_flip_arenas``: ``arenas`` (two WeightArenas, the same
    layout in each), ``views`` (one {name: view} per arena), ``serving`` (0
    or 1: the arena the owner's tensors lie in now). A staged sync writes
    the other arena; on its COMMITTED event (``commit_kind == "flip"``) the
    owner calls ``flip(event)`` between two steps: every tensor is rebound
    to the arena the event names (``p.data = view``, no byte copied) and the
    worker is told (``ack_flip``), so the next staged sync may write the
    arena left."""

    def __init__(self, worker, arenas, views, targets):
        self._worker, self.arenas, self.views = worker, arenas, views
        self._targets = targets  # {name: tensor rebound on each flip}
        self.serving = 0

    def flip(self, event):
        """Follows a COMMITTED event of this pair's worker: a flip onto the
        other arena rebinds every tensor there and acknowledges it; any other
        event changes nothing. Returns whether it flipped."""
        if event.get("kind") != "committed" or event.get("commit_kind") != "flip":
            return False
        onto = event.get("flipped_onto")
        handles = [a.handle for a in self.arenas]
        if onto not in handles:
            raise errors.InvalidArgument(
                f"FlipArenas.flip: the event names arena {onto}, not one of this pair "
                f"({self.arenas[0].handle}, {self.arenas[1].handle})")
        index = handles.index(onto)
        views = self.views[index]
        for name, t in self._targets.items():
            t.data = views[name]
        self.serving = index
        from wsync.embedded import _call
        _call(self._worker._w.ack_flip, onto)
        self._worker._follow(self._targets)
        return True


def pack_into_flip_arenas(worker, tensors, device=None, name=""):
    """Moves `tensors` (as ``pack_into_arena``) into the first arena of a new
    flip pair of `worker` and lays the same tensors out in the second (at
    the same offsets, filled with the same values): each tensor with
    ``.data`` is rebound to its view in the first. Returns a FlipArenas;
    register the tensors given (or the module) with `worker`, never the views
    themselves (a view of the arena a flip left is refused at registration),
    and call ``flips.flip(event)`` on each COMMITTED event."""
    from wsync.embedded import _call
    from wsync.torch import _named
    named = _named(tensors)
    if not named:
        raise errors.InvalidArgument("pack_into_flip_arenas: no tensors given")
    first = _check_one_device(named, device, "pack_into_flip_arenas")
    offsets, total = _layout(named)
    pair = _call(worker._w.create_flip_arenas, int(total), device=_device_index(first), name=name)
    arenas = tuple(WeightArena(worker, total, device=first, name=f"{name or 'pair'}.{i}",
                               _native=native) for i, native in enumerate(pair))
    views = ({}, {})
    targets = {}
    with torch.no_grad():
        for n, t in named:
            for i in (0, 1):
                v = arenas[i].view(offsets[n], t.dtype, t.shape)
                v.copy_(t.detach())
                views[i][n] = v
            t.data = views[0][n]
            targets[n] = t
    if first.type == "cuda":
        # The copies into both arenas land before any sync may write the second.
        torch.cuda.synchronize(first)
    return FlipArenas(worker, arenas, views, targets)
