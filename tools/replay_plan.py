#!/usr/bin/env python3
"""Independent replayer of a wsync plan, written only from docs/plan-format.md
and docs/layout-spec.md (pure Python, no wsync code): fills the source side of
a TransferSpec with synthetic integers, replays every op of the plan JSON
(`wsyncctl plan SPEC --json`) round by round, and checks every destination
element against the spec's mappings.

  replay_plan.py SPEC.json PLAN.json      -> exit 0 and "replay: OK ..." or exit 1

Supports the layouts the catalog produces: mesh form with Shard/Replicate and
explicit row-major or strided fragments; dtypes fp32, bf16, fp16, int32, int64,
fp8_e4m3 (block-quantized destinations: sender-side quantized pieces, their
scale pieces and receiver-side Quantize ops, checked against a reference
quantization written here from docs/layout-spec.md). A bucket's piece runs are
written out as the pieces they stand for (expand_runs).
"""
import json
import struct
import sys
import zlib

SIZE = {"FP32": 4, "BF16": 2, "FP16": 2, "INT32": 4, "INT64": 8, "FP8_E4M3": 1}


def e4m3_value(code):
    """e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no inf, S.1111.111 is NaN."""
    sign, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return float("nan")
    mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -mag if sign else mag


E4M3_POS = sorted((e4m3_value(c), c) for c in range(127))  # finite codes >= 0


def e4m3_code(x):
    """Round to nearest, ties to the even code; beyond 448 saturate (no inf)."""
    if x != x:
        return 0x7F
    sign = 0x80 if (x < 0 or (x == 0 and struct.pack("<f", x)[3] & 0x80)) else 0
    a = abs(x)
    best, best_err = 0, None
    for v, c in E4M3_POS:
        err = abs(v - a)
        if best_err is None or err < best_err or (err == best_err and c % 2 == 0 and best % 2 == 1):
            best, best_err = c, err
    return sign | best


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def quantize_blocks(vals, shape, block):
    """Block fp8 of row-major `vals` laid out in `shape` (blocks over the last two
    dims): scale = amax / 448 in fp32 (1 for an all-zero block), code =
    e4m3(x / scale). Returns (codes, scales row-major over the block grid)."""
    rows, cols = shape[-2], shape[-1]
    outer = 1
    for n in shape[:-2]:
        outer *= n
    br, bc = block
    nbr, nbc = -(-rows // br), -(-cols // bc)
    codes, scales = [0] * len(vals), []
    for o in range(outer):
        for bi in range(nbr):
            for bj in range(nbc):
                cells = [o * rows * cols + r * cols + c
                         for r in range(bi * br, min(rows, (bi + 1) * br))
                         for c in range(bj * bc, min(cols, (bj + 1) * bc))]
                amax = max(abs(vals[k]) for k in cells)
                scale = 1.0 if amax == 0 else f32(f32(amax) / 448.0)
                scales.append(scale)
                for k in cells:
                    codes[k] = e4m3_code(f32(f32(vals[k]) / scale))
    return codes, scales


def encode(value, dtype):
    if dtype == "FP32":
        return struct.pack("<f", value)
    if dtype == "BF16":
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
        return struct.pack("<H", bits & 0xFFFF)
    if dtype == "FP16":
        return struct.pack("<e", value)
    if dtype == "INT32":
        return struct.pack("<i", int(value))
    if dtype == "INT64":
        return struct.pack("<q", int(value))
    if dtype == "FP8_E4M3":
        return bytes([e4m3_code(f32(value))])
    raise ValueError("unsupported dtype " + dtype)


def decode(raw, dtype):
    if dtype == "FP32":
        return struct.unpack("<f", raw)[0]
    if dtype == "BF16":
        return struct.unpack("<f", struct.pack("<I", struct.unpack("<H", raw)[0] << 16))[0]
    if dtype == "FP16":
        return struct.unpack("<e", raw)[0]
    if dtype == "INT32":
        return struct.unpack("<i", raw)[0]
    if dtype == "INT64":
        return struct.unpack("<q", raw)[0]
    if dtype == "FP8_E4M3":
        return e4m3_value(raw[0])
    raise ValueError("unsupported dtype " + dtype)


def ints(xs):
    return [int(x) for x in xs]


def row_major(shape):
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc
        acc *= shape[d]
    return strides


def indices(shape):
    """Row-major multi-indices of `shape`."""
    if any(n == 0 for n in shape):
        return
    idx = [0] * len(shape)
    while True:
        yield tuple(idx)
        d = len(shape) - 1
        while d >= 0:
            idx[d] += 1
            if idx[d] < shape[d]:
                break
            idx[d] = 0
            d -= 1
        if d < 0:
            return


def value(tensor, linear):
    """Synthetic value in [-100, 100]: exact in bf16/fp16/fp32 and integers."""
    return float((zlib.crc32(tensor.encode()) + linear * 2654435761) % 201 - 100)


def chunk(n, parts, i):
    cs = -(-n // parts)
    return min(n, i * cs), min(n, (i + 1) * cs)


def fragments(side):
    """(tensor, dtype, shape, rank, offset, length, buffer, byte_offset, strides) per fragment."""
    out = []
    for t in side.get("tensors", []):
        name, dtype, shape = t["name"], t["dtype"], ints(t.get("shape", []))
        if "mesh" in t:
            m = t["mesh"]
            mesh, ranks = ints(m.get("meshShape", [])), ints(m.get("ranks", []))
            for pos, rank in enumerate(ranks):
                coord, rem = [], pos
                for n in reversed(mesh):
                    coord.append(rem % n)
                    rem //= n
                coord.reverse()
                lo, hi = [0] * len(shape), list(shape)
                for md, p in enumerate(m.get("placements", [])):
                    if "shard" in p:
                        d = int(p["shard"].get("dim", 0))
                        b, e = chunk(hi[d] - lo[d], mesh[md], coord[md])
                        lo[d], hi[d] = lo[d] + b, lo[d] + e
                    elif "replicate" not in p:
                        raise ValueError("placement %s not supported by this replayer" % p)
                length = [h - l for l, h in zip(lo, hi)]
                if any(x == 0 for x in length):
                    continue
                out.append((name, dtype, shape, rank, lo, length, m.get("buffer") or name, 0,
                            row_major(length)))
        else:
            for f in t["fragments"].get("fragments", []):
                box = f.get("box", {})
                length = ints(box.get("length", []))
                strides = ints(f.get("strides", [])) or row_major(length)
                out.append((name, dtype, shape, int(f.get("rank", 0)), ints(box.get("offset", [])),
                            length, f.get("buffer") or name, int(f.get("byteOffset", 0)), strides))
    return out


class Memory:
    def __init__(self):
        self.buffers = {}

    def ensure(self, key, size):
        b = self.buffers.setdefault(key, bytearray())
        if len(b) < size:
            b.extend(b"\0" * (size - len(b)))
        return b

    def view_offsets(self, view):
        es = SIZE[view["dtype"]]
        shape, strides = ints(view.get("shape", [])), ints(view.get("strides", []))
        base = int(view.get("byteOffset", 0))
        for i in indices(shape):
            yield base + es * sum(a * b for a, b in zip(i, strides))


MAX_RUN_MEMBERS = 1 << 22  # common/plan_pieces.h kMaxRunMembers: all runs of a plan together


def expand_runs(bucket, num_names, budget):
    """The bucket's pieces in order (docs/plan-format.md, "Piece runs"): its plain
    `pieces`, then member (j, k) of each run, rows j in order (outerCount rows,
    one without it): `first` with its tensor name, buffer names, byte offsets
    and bucket offset advanced by j outer steps and k steps. Raises ValueError
    for a run this replayer cannot trust; budget[0] counts the members left to
    expand in the whole plan."""
    pieces = list(bucket.get("pieces", []))
    for i, run in enumerate(bucket.get("runs", [])):
        first, count = run.get("first", {}), int(run.get("count", 0))
        outer = int(run.get("outerCount", 0))
        where = "bucket %s run %d" % (bucket.get("id", 0), i)
        if count < 2:
            raise ValueError("%s: count %d (a run has at least 2 members)" % (where, count))
        if outer < 0 or outer == 1:
            raise ValueError("%s: outer_count %d (0: one row; else >= 2)" % (where, outer))
        rows = max(outer, 1)
        budget[0] -= count * rows
        if budget[0] < 0:
            raise ValueError("%s: the plan's runs stand for more than %d pieces"
                             % (where, MAX_RUN_MEMBERS))
        if any(int(first.get(f, 0)) for f in ("reduceId", "quantizeId", "scalesOf")) or \
                first.get("quantBlock"):
            raise ValueError("%s: a run's piece may not be a reduce, quantize or scales piece"
                             % where)

        def stepped(value, field, j, k):
            field = field[0].upper() + field[1:]
            return int(value) + j * int(run.get("outer" + field, 0)) + \
                k * int(run.get(field[0].lower() + field[1:], 0))

        for j in range(rows):
            for k in range(count):
                p = json.loads(json.dumps(first))
                p["tensorName"] = stepped(first.get("tensorName", 0), "tensorNameStep", j, k)
                p["bucketOffset"] = stepped(first.get("bucketOffset", 0), "bucketStep", j, k)
                for side in ("src", "dst"):
                    view = p.setdefault(side, {})
                    view["bufferName"] = stepped(view.get("bufferName", 0),
                                                 side + "BufferStep", j, k)
                    view["byteOffset"] = stepped(view.get("byteOffset", 0),
                                                 side + "ByteStep", j, k)
                    if not 0 <= view["bufferName"] < num_names or view["byteOffset"] < 0:
                        raise ValueError("%s: member (%d, %d)'s %s names no buffer"
                                         % (where, j, k, side))
                pieces.append(p)
    bucket["pieces"] = pieces
    bucket.pop("runs", None)


def main(spec_path, plan_path):
    spec = json.load(open(spec_path))
    plan = json.load(open(plan_path))
    workers = {}
    for side in ("source", "destination"):
        workers[side] = [int(r.get("worker", 0)) for r in spec[side].get("ranks", [])]
    mem = Memory()
    src_frags = fragments(spec["source"])
    dst_frags = fragments(spec["destination"])
    # 1. allocate (and grow for any view the plan reaches), 2. fill the source.
    for side, frags in (("SOURCE_BUFFER", src_frags), ("DESTINATION_BUFFER", dst_frags)):
        for (name, dtype, shape, rank, off, length, buf, bo, strides) in frags:
            extent = bo + SIZE[dtype] * (1 + sum((n - 1) * s for n, s in zip(length, strides)))
            worker = workers["source" if side == "SOURCE_BUFFER" else "destination"][rank]
            mem.ensure((worker, side, buf), extent)
    gstr = {}
    for (name, dtype, shape, rank, off, length, buf, bo, strides) in src_frags:
        g = gstr.setdefault(name, row_major(shape))
        b = mem.buffers[(workers["source"][rank], "SOURCE_BUFFER", buf)]
        for i in indices(length):
            linear = sum((o + x) * s for o, x, s in zip(off, i, g))
            at = bo + SIZE[dtype] * sum(x * s for x, s in zip(i, strides))
            b[at:at + SIZE[dtype]] = encode(value(name, linear), dtype)

    names = plan.get("names", [])

    def buffer_of(view):  # views name their buffer by index into plan["names"]
        return names[int(view.get("bufferName", 0))]

    buckets = plan.get("buckets", [])
    budget = [MAX_RUN_MEMBERS]
    try:
        for b in buckets:
            expand_runs(b, len(names), budget)
    except ValueError as e:
        print("replay: FAILED: %s" % e)
        return 1
    reduces = plan.get("reduces", [])
    for r in range(int(plan.get("numRounds", 0))):
        wire = {}
        for b in buckets:  # pack everything first
            if int(b.get("round", 0)) != r:
                continue
            data = bytearray(int(b.get("bytes", 0)))
            pieces = b.get("pieces", [])
            for k, p in enumerate(pieces):
                if int(p.get("scalesOf", 0)) != 0:
                    continue  # written with the piece it names
                src, wd = p["src"], p["wireDtype"]
                key = (int(b.get("sender", 0)), src.get("side", "SOURCE_BUFFER"), buffer_of(src))
                buf = mem.buffers[key]
                at = int(p.get("bucketOffset", 0))
                if p.get("quantBlock"):
                    vals = [decode(bytes(buf[o:o + SIZE[src["dtype"]]]), src["dtype"])
                            for o in mem.view_offsets(src)]
                    codes, scales = quantize_blocks(vals, ints(p["dst"]["shape"]),
                                                    ints(p["quantBlock"]))
                    data[at:at + len(codes)] = bytes(codes)
                    sp = [q for q in pieces if int(q.get("scalesOf", 0)) == k + 1]
                    if len(sp) != 1:
                        print("replay: FAILED: bucket %s piece %d has %d scale pieces"
                              % (b.get("id", 0), k, len(sp)))
                        return 1
                    sat = int(sp[0].get("bucketOffset", 0))
                    for v in scales:
                        data[sat:sat + 4] = encode(v, "FP32")
                        sat += 4
                    continue
                for o in mem.view_offsets(src):
                    raw = bytes(buf[o:o + SIZE[src["dtype"]]])
                    data[at:at + SIZE[wd]] = encode(decode(raw, src["dtype"]), wd)
                    at += SIZE[wd]
            wire[int(b.get("id", 0))] = data
        for b in buckets:  # then unpack
            if int(b.get("round", 0)) != r:
                continue
            data = wire[int(b.get("id", 0))]
            for p in b.get("pieces", []):
                if int(p.get("reduceId", 0)) != 0 or int(p.get("quantizeId", 0)) != 0:
                    continue
                dst, wd = p["dst"], p["wireDtype"]
                key = (int(b.get("receiver", 0)), dst.get("side", "SOURCE_BUFFER"), buffer_of(dst))
                buf = mem.ensure(key, 0)
                at = int(p.get("bucketOffset", 0))
                for o in mem.view_offsets(dst):
                    v = decode(bytes(data[at:at + SIZE[wd]]), wd)
                    buf[o:o + SIZE[dst["dtype"]]] = encode(v, dst["dtype"])
                    at += SIZE[wd]
        for red in reduces:
            if int(red.get("round", 0)) != r:
                continue
            acc_dtype, sums, count = red["accumulateDtype"], None, 0
            for inp in red.get("inputs", []):
                b = buckets[int(inp.get("bucket", 0))]
                p = b["pieces"][int(inp.get("piece", 0))]
                data, wd, at = wire[int(b.get("id", 0))], p["wireDtype"], int(p.get("bucketOffset", 0))
                n = 1
                for x in ints(p["src"].get("shape", [])):
                    n *= x
                vals = [decode(encode(decode(bytes(data[at + k * SIZE[wd]:at + (k + 1) * SIZE[wd]]), wd),
                                      acc_dtype), acc_dtype) for k in range(n)]
                sums = vals if sums is None else [a + v for a, v in zip(sums, vals)]
                count += 1
            if red.get("op", "REDUCE_SUM") == "REDUCE_AVG":
                sums = [s / count for s in sums]
            dst = red["dst"]
            buf = mem.ensure((int(red.get("worker", 0)), dst.get("side", "SOURCE_BUFFER"), buffer_of(dst)), 0)
            for o, v in zip(mem.view_offsets(dst), sums):
                buf[o:o + SIZE[dst["dtype"]]] = encode(decode(encode(v, acc_dtype), acc_dtype), dst["dtype"])

        for q in plan.get("quantizes", []):
            if int(q.get("round", 0)) != r:
                continue
            shape = ints(q["dst"]["shape"])
            region = {}
            for inp in q.get("inputs", []):
                b = buckets[int(inp.get("bucket", 0))]
                p = b["pieces"][int(inp.get("piece", 0))]
                data, wd, at = wire[int(b.get("id", 0))], p["wireDtype"], int(p.get("bucketOffset", 0))
                off = ints(inp.get("offset", []))
                for i in indices(ints(p["dst"]["shape"])):
                    g = tuple(a + x for a, x in zip(off, i))
                    if g in region:
                        print("replay: FAILED: quantize %s: inputs overlap" % q.get("id"))
                        return 1
                    region[g] = decode(bytes(data[at:at + SIZE[wd]]), wd)
                    at += SIZE[wd]
            cells = list(indices(shape))
            if set(region) != set(cells):
                print("replay: FAILED: quantize %s: inputs do not cover its region" % q.get("id"))
                return 1
            codes, scales = quantize_blocks([region[tuple(i)] for i in cells], shape,
                                            ints(q["block"]))
            w = int(q.get("worker", 0))
            for view, vals in ((q["dst"], [bytes([c]) for c in codes]),
                               (q["scaleDst"], [encode(v, "FP32") for v in scales])):
                buf = mem.ensure((w, view.get("side", "SOURCE_BUFFER"), buffer_of(view)), 0)
                for o, raw in zip(mem.view_offsets(view), vals):
                    buf[o:o + len(raw)] = raw

    # 4. check every destination element through the mappings.
    maps = {}
    for m in spec.get("mappings", []):
        maps.setdefault(m["dst"], []).append(m)
    src_dtype = {t["name"]: t["dtype"] for t in spec["source"].get("tensors", [])}
    src_shape = {t["name"]: ints(t.get("shape", [])) for t in spec["source"].get("tensors", [])}
    quant = {t["name"]: t["blockQuantization"] for t in spec["destination"].get("tensors", [])
             if t.get("blockQuantization")}
    scale_of = {q["scaleTensor"]: w for w, q in quant.items()}
    want_scales = {}  # (worker, scale tensor, block index) -> scale
    checked = 0
    order = sorted(dst_frags, key=lambda f: f[0] in scale_of)  # scales after their weights
    for (name, dtype, shape, rank, off, length, buf, bo, strides) in order:
        worker = workers["destination"][rank]
        b = mem.buffers[(worker, "DESTINATION_BUFFER", buf)]
        if name in scale_of:
            for i in indices(length):
                g = tuple(o + x for o, x in zip(off, i))
                want = want_scales.get((worker, name, g))
                at = bo + 4 * sum(x * s for x, s in zip(i, strides))
                got = decode(bytes(b[at:at + 4]), "FP32")
                if want is None or got != want:
                    print("replay: FAILED: scale %s %s on worker %d is %r, expected %r"
                          % (name, list(g), worker, got, want))
                    return 1
                checked += 1
            continue
        entries = maps.get(name) or [{"dst": name, "dstOffset": [0] * len(shape), "src": name,
                                      "srcBox": {"offset": [0] * len(shape), "length": shape}}]
        wants = []
        for i in indices(length):
            g = [o + x for o, x in zip(off, i)]
            for m in entries:
                do = ints(m.get("dstOffset", []))
                so, sl = ints(m["srcBox"].get("offset", [])), ints(m["srcBox"].get("length", []))
                rel = [x - d for x, d in zip(g, do)]
                if all(0 <= x < n for x, n in zip(rel, sl)):
                    break
            else:
                print("replay: FAILED: %s %s on worker %d is fed by no mapping" % (name, g, worker))
                return 1
            src = m["src"]
            linear = sum((s + x) * st for s, x, st in zip(so, rel, row_major(src_shape[src])))
            if name in quant:  # the source value; quantized below, fragment-wise
                wants.append(decode(encode(value(src, linear), src_dtype[src]), src_dtype[src]))
                continue
            want = decode(encode(decode(encode(value(src, linear), src_dtype[src]), src_dtype[src]),
                                 dtype), dtype)
            at = bo + SIZE[dtype] * sum(x * s for x, s in zip(i, strides))
            got = decode(bytes(b[at:at + SIZE[dtype]]), dtype)
            if got != want:
                print("replay: FAILED: %s %s on worker %d is %r, expected %r (from %s index %d)"
                      % (name, g, worker, got, want, src, linear))
                return 1
            checked += 1
        if name in quant:
            # Fragments of a quantized tensor hold whole blocks: quantize the
            # fragment's source values and compare codes and scales.
            block = ints(quant[name].get("block", [])) or [128, 128]
            codes, scales = quantize_blocks(wants, length, block)
            for k, i in enumerate(indices(length)):
                at = bo + sum(x * s for x, s in zip(i, strides))
                if b[at] != codes[k]:
                    print("replay: FAILED: %s %s on worker %d is fp8 0x%02x, expected 0x%02x"
                          % (name, [o + x for o, x in zip(off, i)], worker, b[at], codes[k]))
                    return 1
                checked += 1
            grid = list(length[:-2]) + [-(-length[-2] // block[0]), -(-length[-1] // block[1])]
            goff = list(off[:-2]) + [off[-2] // block[0], off[-1] // block[1]]
            for k, i in enumerate(indices(grid)):
                g = tuple(o + x for o, x in zip(goff, i))
                want_scales[(worker, quant[name]["scaleTensor"], g)] = scales[k]
    print("replay: OK (%d buckets, %d reduces, %d destination elements checked)"
          % (len(buckets), len(reduces), checked))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
