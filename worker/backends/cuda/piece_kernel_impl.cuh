// The piece kernel's device code, as templates: piece_kernels.cu
// instantiates the production configurations; bench/gpu/copy_variants.cu
// others, to measure them against it.
//
// Conversions here reproduce common/cast.cc bit for bit (round to nearest
// even, NaN quieted with its top payload bits kept, e4m3fn saturating), using
// integer bit manipulation only, so no device float rounding mode or NaN
// canonicalization can change a result.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_PIECE_KERNEL_IMPL_CUH_
#define WSYNC_WORKER_BACKENDS_CUDA_PIECE_KERNEL_IMPL_CUH_

#include <cstdint>

#include "worker/backends/cuda/piece_desc.h"

namespace wsync::cuda::piece_impl {

// wsync.v1.DType values (kept numeric so this file needs no protobuf).
constexpr int kFp32 = 1;
constexpr int kBf16 = 2;
constexpr int kFp16 = 3;
constexpr int kE4M3 = 4;
constexpr int kE5M2 = 5;

constexpr int kThreads = 256;
// Production configuration (piece_kernels.cu): a warp item is 32 lanes x
// kPerLane units (int4 for vector copies), and a task is claimed in
// kPartsPerTask parts, one warp each.
constexpr int kPerLane = 8;
constexpr int kPartsPerTask = 8;

__device__ __forceinline__ uint64_t RoundShift(uint64_t v, int shift) {
  if (shift <= 0) return v;
  if (shift >= 63) return 0;
  const uint64_t q = v >> shift;
  const uint64_t rem = v & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  return (rem > half || (rem == half && (q & 1))) ? q + 1 : q;
}

// A narrow float with e exponent and m mantissa bits; !ieee = "fn" (no inf).
__device__ inline uint32_t FloatToNarrow(uint32_t bits, int e, int m, bool ieee) {
  const int bias = (1 << (e - 1)) - 1;
  const uint32_t exp_mask = (1u << e) - 1;
  const uint32_t man_mask = (1u << m) - 1;
  const uint32_t inf_code = exp_mask << m;
  const uint32_t max_code =
      ieee ? (((exp_mask - 1) << m) | man_mask) : ((exp_mask << m) | (man_mask - 1));
  const uint32_t sign_out = (bits >> 31) << (e + m);
  const uint32_t exp8 = (bits >> 23) & 0xFF;
  const uint32_t man = bits & 0x7FFFFF;
  if (exp8 == 0xFF) {
    if (man != 0) {
      if (!ieee) return sign_out | (exp_mask << m) | man_mask;
      return sign_out | inf_code | (1u << (m - 1)) | (man >> (23 - m));
    }
    return sign_out | (ieee ? inf_code : max_code);
  }
  const int emin = 1 - bias;
  const int ex = exp8 == 0 ? -126 : static_cast<int>(exp8) - 127;
  uint64_t r;
  if (exp8 != 0 && ex >= emin) {
    const uint64_t combined = (static_cast<uint64_t>(ex - emin + 1) << 23) | man;
    r = RoundShift(combined, 23 - m);
  } else {
    const uint64_t full = exp8 == 0 ? man : (man | 0x800000u);
    r = RoundShift(full, 23 - m + (emin - ex));
  }
  if (r > max_code) r = ieee ? inf_code : max_code;
  return sign_out | static_cast<uint32_t>(r);
}

__device__ inline uint32_t NarrowToFloat(uint32_t code, int e, int m, bool ieee) {
  const int bias = (1 << (e - 1)) - 1;
  const uint32_t exp_mask = (1u << e) - 1;
  const uint32_t man_mask = (1u << m) - 1;
  const uint32_t sign = (code >> (e + m)) & 1;
  const uint32_t exp = (code >> m) & exp_mask;
  const uint32_t man = code & man_mask;
  if (exp == exp_mask) {
    if (ieee) {
      if (man == 0) return (sign << 31) | 0x7F800000u;
      return (sign << 31) | 0x7FC00000u | (man << (23 - m));
    }
    if (man == man_mask) return (sign << 31) | 0x7FC00000u;
  }
  if (exp == 0) {
    // Subnormal: man * 2^(1 - bias - m), exact in fp32.
    const float v = ldexpf(static_cast<float>(man), 1 - bias - m);
    return __float_as_uint(sign ? -v : v);
  }
  return (sign << 31) | ((exp - bias + 127) << 23) | (man << (23 - m));
}

__device__ __forceinline__ uint32_t FloatToBf16(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (bits >> 16) | 0x40;
  return (bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16;
}

// fp32 bits of the element at p.
__device__ __forceinline__ uint32_t LoadBits(const char* p, int dtype) {
  switch (dtype) {
    case kFp32:
      return *reinterpret_cast<const uint32_t*>(p);
    case kBf16:
      return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16;
    case kFp16:
      return NarrowToFloat(*reinterpret_cast<const uint16_t*>(p), 5, 10, true);
    case kE4M3:
      return NarrowToFloat(*reinterpret_cast<const uint8_t*>(p), 4, 3, false);
    default:
      return NarrowToFloat(*reinterpret_cast<const uint8_t*>(p), 5, 2, true);
  }
}

__device__ __forceinline__ uint32_t NarrowCode(uint32_t bits, int dtype) {
  switch (dtype) {
    case kFp32:
      return bits;
    case kBf16:
      return FloatToBf16(bits);
    case kFp16:
      return FloatToNarrow(bits, 5, 10, true);
    case kE4M3:
      return FloatToNarrow(bits, 4, 3, false);
    default:
      return FloatToNarrow(bits, 5, 2, true);
  }
}

__device__ __forceinline__ void StoreBits(char* p, int dtype, uint32_t bits) {
  const uint32_t code = NarrowCode(bits, dtype);
  switch (dtype) {
    case kFp32:
      *reinterpret_cast<uint32_t*>(p) = code;
      break;
    case kBf16:
    case kFp16:
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(code);
      break;
    default:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(code);
      break;
  }
}

// fp32 bits of the value rounded to `dtype` (a round trip through it).
__device__ __forceinline__ uint32_t RoundBits(uint32_t bits, int dtype) {
  switch (dtype) {
    case kFp32:
      return bits;
    case kBf16:
      return FloatToBf16(bits) << 16;
    case kFp16:
      return NarrowToFloat(FloatToNarrow(bits, 5, 10, true), 5, 10, true);
    case kE4M3:
      return NarrowToFloat(FloatToNarrow(bits, 4, 3, false), 4, 3, false);
    default:
      return NarrowToFloat(FloatToNarrow(bits, 5, 2, true), 5, 2, true);
  }
}

__device__ __forceinline__ void CopyRaw(char* d, const char* s, int esize) {
  switch (esize) {
    case 1:
      *d = *s;
      break;
    case 2:
      *reinterpret_cast<uint16_t*>(d) = *reinterpret_cast<const uint16_t*>(s);
      break;
    case 4:
      *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(s);
      break;
    default:
      *reinterpret_cast<uint64_t*>(d) = *reinterpret_cast<const uint64_t*>(s);
      break;
  }
}

__device__ __forceinline__ uint64_t LoadInt(const char* p, int esize) {
  switch (esize) {
    case 1:
      return static_cast<uint64_t>(*reinterpret_cast<const int8_t*>(p));
    case 4:
      return static_cast<uint64_t>(*reinterpret_cast<const int32_t*>(p));
    default:
      return *reinterpret_cast<const uint64_t*>(p);
  }
}

__device__ __forceinline__ void StoreInt(char* p, int esize, uint64_t v) {
  switch (esize) {
    case 1:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      break;
    case 4:
      *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(v);
      break;
    default:
      *reinterpret_cast<uint64_t*>(p) = v;
      break;
  }
}

__device__ __forceinline__ bool IsFloatDtype(int d) { return d >= kFp32 && d <= kE5M2; }

// Element offsets of the first element of row `row` (outer dims 0..2).
__device__ __forceinline__ void RowOffsets(const PieceDesc& p, int64_t row, int64_t* so,
                                           int64_t* dof) {
  const int64_t i2 = row % p.shape[2];
  const int64_t t = row / p.shape[2];
  const int64_t i1 = t % p.shape[1];
  const int64_t i0 = t / p.shape[1];
  *so = i0 * p.src_stride[0] + i1 * p.src_stride[1] + i2 * p.src_stride[2];
  *dof = i0 * p.dst_stride[0] + i1 * p.dst_stride[1] + i2 * p.dst_stride[2];
}

__device__ inline void ReduceElement(const PieceDesc& p, const uint64_t* in, int64_t eoff,
                                     char* dp) {
  if (!IsFloatDtype(p.acc_dtype)) {  // integer SUM wraps, like the host
    uint64_t sum = 0;
    for (int i = 0; i < p.num_inputs; ++i) {
      sum += LoadInt(reinterpret_cast<const char*>(in[i]) + eoff, p.src_esize);
    }
    StoreInt(dp, p.dst_esize, sum);
    return;
  }
  float acc = 0.f;
  for (int i = 0; i < p.num_inputs; ++i) {
    uint32_t b = LoadBits(reinterpret_cast<const char*>(in[i]) + eoff, p.src_dtype);
    if (p.src_dtype != p.acc_dtype) b = RoundBits(b, p.acc_dtype);
    // Starting from input 0 (not 0.f) keeps -0 + -0 = -0, as on the host.
    acc = i == 0 ? __uint_as_float(b) : __fadd_rn(acc, __uint_as_float(b));
  }
  if (p.average) acc = __fdiv_rn(acc, static_cast<float>(p.num_inputs));
  StoreBits(dp, p.dst_dtype, RoundBits(__float_as_uint(acc), p.acc_dtype));
}

// One warp item: columns [cbeg, cend) (in units) of the row whose first
// elements are at element offsets so / dof.
template <bool kCopyOnly, int kPerLane>
__device__ __forceinline__ void ProcessSegment(const PieceDesc& p, int mode, int64_t so,
                                               int64_t dof, int64_t col0, int64_t cbeg,
                                               int64_t cend, int lane, const uint64_t* inputs) {
  if (mode == kModeVecCopy) {
    // Row bases are 16-byte aligned (checked on the host); units are int4.
    const int4* s =
        reinterpret_cast<const int4*>(reinterpret_cast<const char*>(p.src) + so * p.src_esize) +
        col0;
    int4* d = reinterpret_cast<int4*>(reinterpret_cast<char*>(p.dst) + dof * p.dst_esize) + col0;
    int4 v[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t c = cbeg + lane + 32 * k;
      if (c < cend) v[k] = __ldg(s + c);
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t c = cbeg + lane + 32 * k;
      if (c < cend) d[c] = v[k];
    }
    return;
  }
  const int64_t ss = p.src_stride[3], ds = p.dst_stride[3];
  char* d = reinterpret_cast<char*>(p.dst);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t c = cbeg + lane + 32 * k;
    if (c >= cend) continue;
    const int64_t col = col0 + c;
    char* dp = d + (dof + col * ds) * p.dst_esize;
    if (!kCopyOnly && mode == kModeReduce) {
      // Inputs are contiguous over the piece's shape: src strides index them.
      ReduceElement(p, inputs + p.src, (so + col * ss) * p.src_esize, dp);
      continue;
    }
    const char* sp = reinterpret_cast<const char*>(p.src) + (so + col * ss) * p.src_esize;
    if (kCopyOnly || mode == kModeRawCopy) {
      CopyRaw(dp, sp, p.src_esize);
    } else {
      StoreBits(dp, p.dst_dtype, LoadBits(sp, p.src_dtype));
    }
  }
}

// Vector copy of a 2-D piece's task whose rows are narrower than a warp item
// (3-D pieces take the one-row-per-item path): the item is
// units [first, end) of the task's rows laid end to end, so every lane moves
// kPerLane units however narrow the rows (one row per item would leave most
// lanes idle: Qwen3's expert halves are 48 units, and the copy then kept a
// fifth of the bytes in flight). Flat offsets fit in int: a task holds at
// most PieceTable::kTaskElements elements.
template <int kPerLane>
__device__ __forceinline__ void CopyNarrowRows(const PieceDesc& p, int64_t row0, int cols,
                                               int64_t col0, int first, int end, int lane) {
  const char* src = reinterpret_cast<const char*>(p.src);
  char* dst = reinterpret_cast<char*>(p.dst);
  const int64_t ss = p.src_stride[2] * p.src_esize, ds = p.dst_stride[2] * p.dst_esize;
  // The walk over (row, column) runs twice, loads then stores, rather than
  // keeping kPerLane destination pointers live (they would spill). The
  // carry loop runs once per step for rows of 32 units or more; a constant-
  // time step (32 / cols rows, 32 % cols columns) made the copy kernel spill.
  int4 v[kPerLane];
  int r = (first + lane) / cols;
  int c = first + lane - r * cols;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (first + lane + 32 * k < end) {
      v[k] = __ldg(reinterpret_cast<const int4*>(src + (row0 + r) * ss) + col0 + c);
    }
    c += 32;
    while (c >= cols) {
      c -= cols;
      ++r;
    }
  }
  r = (first + lane) / cols;
  c = first + lane - r * cols;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (first + lane + 32 * k < end) {
      reinterpret_cast<int4*>(dst + (row0 + r) * ds)[col0 + c] = v[k];
    }
    c += 32;
    while (c >= cols) {
      c -= cols;
      ++r;
    }
  }
}

// Tables of plain copies get their own instantiation: without the cast and
// reduce paths it needs fewer registers, so more blocks fit on an SM beside
// other kernels (puts, NCCL).
//
// Work is handed out in parts: claim c is part c % kPartsPerTask of task
// c / kPartsPerTask, and a part is every kPartsPerTask-th warp item of its
// task. Each warp claims its own parts from *next_task (no block barriers),
// with its next claim in flight while it copies. So warps of a kernel that
// starts late, once another kernel frees SM slots, still share what is left,
// and consecutive claims keep the GPU's accesses close together.
// Blocks placed on SMs [0, reserved_sms) leave at once, all but the grid's
// last: a kernel beside this one (the puts) keeps those SMs, and the work
// is still done when every block landed there (a small grid, or the other
// SMs busy): the last block claims whatever the others left.
template <bool kCopyOnly, int kMinBlocks, int kPerLane = piece_impl::kPerLane,
          int kPartsPerTask = piece_impl::kPartsPerTask>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    PieceKernel(const PieceDesc* __restrict__ pieces, const TaskDesc* __restrict__ tasks,
                int64_t num_tasks, const uint64_t* __restrict__ inputs,
                unsigned long long* next_task, unsigned reserved_sms = 0) {
  constexpr int kItemUnits = 32 * kPerLane;  // units per warp item
  if (reserved_sms > 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if (sm < reserved_sms && blockIdx.x + 1 != gridDim.x) return;
  }
  const int lane = threadIdx.x & 31;
  unsigned long long claim = 0;
  if (lane == 0) claim = atomicAdd(next_task, 1ull);
  claim = __shfl_sync(0xffffffffu, claim, 0);
  for (;;) {
    const int64_t t = static_cast<int64_t>(claim / kPartsPerTask);
    const int part = static_cast<int>(claim % kPartsPerTask);
    if (t >= num_tasks) break;
    unsigned long long ahead = 0;
    if (lane == 0) ahead = atomicAdd(next_task, 1ull);
    const TaskDesc task = tasks[t];
    const PieceDesc& p = pieces[task.piece];
    const int mode = p.mode;
    const int unit = mode == kModeVecCopy ? 16 / p.src_esize : 1;
    const int64_t cols = task.ncols / unit;  // in units
    const int64_t col0 = task.col0 / unit;
    const int64_t items_per_row = (cols + kItemUnits - 1) / kItemUnits;
    if (task.nrows == 1) {
      // One row (every contiguous piece): its offsets once, no divisions.
      int64_t so, dof;
      RowOffsets(p, task.row0, &so, &dof);
      for (int64_t item = part; item < items_per_row; item += kPartsPerTask) {
        const int64_t cbeg = item * kItemUnits;
        ProcessSegment<kCopyOnly, kPerLane>(p, mode, so, dof, col0, cbeg,
                                            min(cbeg + kItemUnits, cols), lane, inputs);
      }
    } else if (mode == kModeVecCopy && cols < kItemUnits && p.shape[0] == 1 && p.shape[1] == 1) {
      const int units = static_cast<int>(task.nrows * cols);
      for (int item = part; item * kItemUnits < units; item += kPartsPerTask) {
        CopyNarrowRows<kPerLane>(p, task.row0, static_cast<int>(cols), col0, item * kItemUnits,
                                 min((item + 1) * kItemUnits, units), lane);
      }
    } else {
      const int64_t items = task.nrows * items_per_row;
      for (int64_t item = part; item < items; item += kPartsPerTask) {
        const int64_t r = item / items_per_row;
        const int64_t cbeg = (item - r * items_per_row) * kItemUnits;
        int64_t so, dof;
        RowOffsets(p, task.row0 + r, &so, &dof);
        ProcessSegment<kCopyOnly, kPerLane>(p, mode, so, dof, col0, cbeg,
                                            min(cbeg + kItemUnits, cols), lane, inputs);
      }
    }
    claim = __shfl_sync(0xffffffffu, ahead, 0);
  }
}

}  // namespace wsync::cuda::piece_impl

#endif  // WSYNC_WORKER_BACKENDS_CUDA_PIECE_KERNEL_IMPL_CUH_
