"""Objects with torch.distributed.tensor's DTensor / Placement / DeviceMesh
attributes (torch 1.13 has no DTensor): enough for wsync.layouts and
wsync.torch.register, with local shards cut by the rules DTensor uses."""
import torch

from harness import chunk_bounds


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def is_replicate(self):
        return False

    def is_partial(self):
        return False


class StridedShard(Shard):
    def __init__(self, dim, split_factor):
        super().__init__(dim)
        self.split_factor = split_factor


class Replicate:
    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return True

    def is_partial(self):
        return False


class Partial(Replicate):
    def __init__(self, reduce_op="sum"):
        self.reduce_op = reduce_op

    def is_replicate(self):
        return False

    def is_partial(self):
        return True


class DeviceMesh:
    def __init__(self, ranks):
        self.mesh = torch.as_tensor(ranks)


def local_indices(length, placements_on_dim, mesh_shape, coord):
    """Global positions a rank holds along one tensor dim, in local order."""
    idx = list(range(length))
    for m, p in placements_on_dim:
        n, c = mesh_shape[m], coord[m]
        if isinstance(p, StridedShard):
            out = []
            for j in range(p.split_factor):
                lo, hi = chunk_bounds(len(idx), p.split_factor, j)
                chunk = idx[lo:hi]
                a, b = chunk_bounds(len(chunk), n, c)
                out += chunk[a:b]
            idx = out
        elif isinstance(p, Shard):
            a, b = chunk_bounds(len(idx), n, c)
            idx = idx[a:b]
    return idx


class DTensor:
    """A parameter of global tensor `full` on mesh `mesh_ranks` (nested list of
    global ranks) with `placements`, as seen by global rank `rank`."""

    def __init__(self, full, mesh_ranks, placements, rank):
        self.device_mesh = DeviceMesh(mesh_ranks)
        self.placements = tuple(placements)
        self.shape = full.shape
        self.dtype = full.dtype
        grid = self.device_mesh.mesh
        pos = (grid == rank).nonzero()
        assert len(pos) == 1, f"rank {rank} not in mesh"
        coord = pos[0].tolist()
        local = full
        for d in range(full.dim()):
            on_d = [(m, p) for m, p in enumerate(placements)
                    if isinstance(p, Shard) and p.dim == d]
            idx = local_indices(full.shape[d], on_d, list(grid.shape), coord)
            local = local.index_select(d, torch.as_tensor(idx, dtype=torch.long))
        self._local = local.contiguous()

    def to_local(self):
        return self._local
