// The checksum kernels' throughput on one GPU (issue 20: a receiver's
// direct-write checksum must keep up with NVLink and leave a short tail):
// GB/s of hashing 1 GiB (by default) already in HBM, each case checked
// against the host's chunk_hash sum of the same bytes.
//   chunk:      LaunchChunkHashSum over the range (a packed bucket);
//   wire_one:   LaunchWireHashSum, the range as one raw item;
//   wire_llama: the range cut into 256 MiB buckets of Llama-3-8B-sized
//               items (4096 x {4096, 1024, 14336} bf16), one launch each;
//   wire_odd:   items at odd byte offsets and an fp32 -> bf16 item, so the
//               word-by-word and boundary paths run too (checked, timed);
//   *_session18: wire_one and wire_llama through session 18's interior
//               kernel (wire_hash_variants.h), to compare.
// Each with grids of 1, 2, 4 (CudaDataOps' default), 8 and 16 blocks per SM.
//   wsync_bench_wire_hash [--mib 1024] [--iters 10]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu/wire_hash_variants.h"
#include "common/chunk_hash.h"
#include "worker/backends/cuda/checksum_kernel.h"
#include "worker/backends/cuda/wire_hash_kernel.h"

namespace wsync::cuda {
namespace {

constexpr int kBf16 = 2;  // wsync.v1.DType values
constexpr int kFp32 = 1;

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// One bucket's table on the device (the layout CudaDataOps uploads).
struct Uploaded {
  void* buffer = nullptr;
  WireHashDeviceTable view;
  uint64_t zero_sum = 0;
  int64_t bytes = 0;
};

Uploaded Upload(std::vector<WireHashDesc> items, int64_t bucket_bytes) {
  const WireHashTable t = BuildWireHashTable(std::move(items), bucket_bytes);
  const size_t item_bytes = t.items.size() * sizeof(WireHashDesc);
  std::vector<unsigned char> host(item_bytes);
  std::memcpy(host.data(), t.items.data(), item_bytes);
  for (const std::vector<int64_t>* v : {&t.first_word, &t.interior_before, &t.boundary_words}) {
    const auto* b = reinterpret_cast<const unsigned char*>(v->data());
    host.insert(host.end(), b, b + v->size() * sizeof(int64_t));
  }
  Uploaded u;
  CHECK_CUDA(cudaMalloc(&u.buffer, host.size()));
  CHECK_CUDA(cudaMemcpy(u.buffer, host.data(), host.size(), cudaMemcpyHostToDevice));
  auto* base = static_cast<unsigned char*>(u.buffer);
  u.view.items = reinterpret_cast<const WireHashDesc*>(base);
  u.view.first_word = reinterpret_cast<const int64_t*>(base + item_bytes);
  u.view.interior_before = u.view.first_word + t.first_word.size();
  u.view.boundary_words = u.view.interior_before + t.interior_before.size();
  u.view.num_items = static_cast<int64_t>(t.items.size());
  u.view.num_boundary = static_cast<int64_t>(t.boundary_words.size());
  u.view.interior_words = t.interior_before.back();
  u.zero_sum = t.zero_sum;
  u.bytes = bucket_bytes;
  return u;
}

WireHashDesc RawItem(const unsigned char* data, int64_t offset, int64_t bytes) {
  WireHashDesc d;
  d.data = data;
  d.offset = offset;
  d.bytes = bytes;
  d.shape[0] = bytes / 2;
  d.strides[0] = 1;
  d.src_dtype = d.via_dtype = d.wire_dtype = kBf16;
  d.src_size = d.wire_size = 2;
  d.raw = 1;
  return d;
}

// The host's sum of the wire image: `image` is the bucket's bytes.
uint64_t HostSum(const std::vector<unsigned char>& image) {
  uint64_t s = 0;
  const int64_t words = static_cast<int64_t>(image.size()) / 8;
  for (int64_t k = 0; k < words; ++k) {
    uint64_t w = 0;
    std::memcpy(&w, image.data() + 8 * k, 8);
    s += chunk_hash::Term(w, k);
  }
  if (image.size() % 8 != 0) {
    s += chunk_hash::Term(chunk_hash::TailWord(image.data() + 8 * words, image.size() % 8), words);
  }
  return s;
}

uint16_t Bf16Of(float f) {  // round to nearest even (finite values only here)
  uint32_t b = 0;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

struct Case {
  std::string name;
  std::vector<Uploaded> buckets;
  uint64_t want = 0;  // the sum of every bucket's hash: sum of their Finish
};

uint64_t FinishAll(const std::vector<Uploaded>& b, const std::vector<unsigned long long>& sums) {
  uint64_t h = 0;
  for (size_t i = 0; i < b.size(); ++i)
    h += chunk_hash::Finish(sums[i] + b[i].zero_sum, b[i].bytes);
  return h;
}

int Run(int argc, char** argv) {
  int64_t mib = 1024;
  int iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--mib") {
      mib = std::atoll(argv[i + 1]);
    } else if (k == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (mib < 64 || iters < 1) {
    std::fprintf(stderr, "--mib must be at least 64 and --iters at least 1\n");
    return 2;
  }
  const int64_t bytes = mib << 20;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<unsigned char> host(static_cast<size_t>(bytes));
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i + 8 <= host.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    // No fp32 NaN or infinity (wire_odd reads fp32; NaN payloads are
    // cast.h's business, tested in checksum_kernel_test).
    const uint64_t w = x & ~((uint64_t{1} << 62) | (uint64_t{1} << 30));
    std::memcpy(host.data() + i, &w, 8);
  }
  void* dev_mem = nullptr;
  CHECK_CUDA(cudaMalloc(&dev_mem, static_cast<size_t>(bytes)));
  auto* dev = static_cast<unsigned char*>(dev_mem);
  CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  void* sums_mem = nullptr;
  CHECK_CUDA(cudaMalloc(&sums_mem, 4096 * sizeof(unsigned long long)));
  auto* sums = static_cast<unsigned long long*>(sums_mem);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  std::vector<Case> cases;
  const uint64_t whole = chunk_hash::Finish(HostSum(host), bytes);
  cases.push_back({"wire_one", {Upload({RawItem(dev, 0, bytes)}, bytes)}, whole});
  {
    // Llama-3-8B-sized items (bf16 rows of 4096), packed into 256 MiB buckets.
    Case c{"wire_llama", {}, 0};
    const int64_t sizes[] = {4096LL * 4096 * 2, 4096LL * 1024 * 2,  4096LL * 1024 * 2,
                             4096LL * 4096 * 2, 4096LL * 14336 * 2, 4096LL * 14336 * 2,
                             4096LL * 14336 * 2};
    const int64_t cap = int64_t{256} << 20;
    int64_t at = 0;
    size_t next = 0;
    while (at < bytes) {
      std::vector<WireHashDesc> items;
      int64_t fill = 0;
      while (at + fill < bytes) {
        const int64_t want = std::min(sizes[next % 7], bytes - at - fill);
        if (fill > 0 && fill + want > cap) break;
        items.push_back(RawItem(dev + at + fill, fill, want));
        fill += want;
        ++next;
      }
      std::vector<unsigned char> image(host.begin() + at, host.begin() + at + fill);
      c.want += chunk_hash::Finish(HostSum(image), fill);
      c.buckets.push_back(Upload(std::move(items), fill));
      at += fill;
    }
    cases.push_back(std::move(c));
  }
  {
    // 64 MiB buckets: an item at byte 3 (odd, unaligned), a gap, an fp32
    // item narrowed to bf16, and a raw item to the end.
    Case c{"wire_odd", {}, 0};
    const int64_t b = int64_t{64} << 20;
    for (int64_t at = 0; at + b <= bytes; at += b) {
      const int64_t first = b / 4 - 6;  // bytes of the odd item (even: bf16)
      const int64_t conv = b / 4;       // wire bytes of the converted item
      const int64_t conv_at = b / 4 + 8, raw_at = conv_at + conv;
      std::vector<WireHashDesc> items;
      items.push_back(RawItem(dev + at + 1, 3, first));
      WireHashDesc f;
      f.data = dev + at + b / 2;  // fp32 source: 2 * conv bytes read
      f.offset = conv_at;
      f.bytes = conv;
      f.shape[0] = conv / 2;
      f.strides[0] = 1;
      f.src_dtype = f.via_dtype = kFp32;
      f.wire_dtype = kBf16;
      f.src_size = 4;
      f.wire_size = 2;
      items.push_back(f);
      items.push_back(RawItem(dev + at + raw_at, raw_at, b - raw_at));
      std::vector<unsigned char> image(static_cast<size_t>(b), 0);
      std::memcpy(image.data() + 3, host.data() + at + 1, first);
      for (int64_t e = 0; e < conv / 2; ++e) {
        float v = 0;
        std::memcpy(&v, host.data() + at + b / 2 + 4 * e, 4);
        const uint16_t h = Bf16Of(v);
        std::memcpy(image.data() + conv_at + 2 * e, &h, 2);
      }
      std::memcpy(image.data() + raw_at, host.data() + at + raw_at, b - raw_at);
      c.want += chunk_hash::Finish(HostSum(image), b);
      c.buckets.push_back(Upload(std::move(items), b));
    }
    cases.push_back(std::move(c));
  }

  {
    // The GPU conformance case WireChecksumOfLargeRawItemsIsTheHashOfTheBucketImage's
    // layout (tests/worker/plane/data_ops_conformance.h), as the data ops
    // describe views (2-D, [1, n]): bf16 at 0, fp32 from 8 bytes into its
    // memory at 80000, bf16 at the odd offset 160003, zeros to 220016.
    Case c{"wire_conf", {}, 0};
    const int64_t bucket = 220016;
    struct Part {
      int32_t dtype, size;
      int64_t elements, skip, offset;
    };
    const Part parts[] = {{kBf16, 2, 40000, 0, 0}, {kFp32, 4, 20000, 2, 80000},
                          {kBf16, 2, 30001, 0, 160003}};
    std::vector<WireHashDesc> items;
    std::vector<unsigned char> image(static_cast<size_t>(bucket), 0);
    int64_t src_at = 0;
    for (const Part& pt : parts) {
      WireHashDesc d;
      d.data = dev + src_at + pt.skip * pt.size;
      d.offset = pt.offset;
      d.bytes = pt.elements * pt.size;
      d.ndim = 2;
      d.shape[0] = 1;
      d.shape[1] = pt.elements;
      d.strides[0] = pt.elements;
      d.strides[1] = 1;
      d.src_dtype = d.via_dtype = d.wire_dtype = pt.dtype;
      d.src_size = d.wire_size = pt.size;
      d.raw = 1;
      items.push_back(d);
      std::memcpy(image.data() + pt.offset, host.data() + src_at + pt.skip * pt.size,
                  static_cast<size_t>(d.bytes));
      src_at += (pt.elements + pt.skip) * pt.size + 256;
      src_at = (src_at + 255) / 256 * 256;
    }
    c.want = chunk_hash::Finish(HostSum(image), bucket);
    c.buckets.push_back(Upload(std::move(items), bucket));
    cases.push_back(std::move(c));
  }

  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  auto time_it = [&](const char* name, int grid_per_sm, int64_t read_bytes, auto&& launch,
                     const std::vector<Uploaded>* b, uint64_t want) {
    std::vector<float> ms;
    bool ok = true;
    for (int i = 0; i <= iters; ++i) {
      CHECK_CUDA(cudaMemsetAsync(sums, 0, 4096 * sizeof(unsigned long long), stream));
      CHECK_CUDA(cudaEventRecord(start, stream));
      launch(grid_per_sm * sms);
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (i > 0) ms.push_back(t);
      std::vector<unsigned long long> got(b == nullptr ? 1 : b->size());
      CHECK_CUDA(cudaMemcpy(got.data(), sums, got.size() * sizeof(got[0]), cudaMemcpyDeviceToHost));
      const uint64_t h = b == nullptr ? chunk_hash::Finish(got[0], bytes) : FinishAll(*b, got);
      ok = ok && h == want;
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    absl::PrintF(
        "RESULT {\"bench\":\"wire_hash\",\"case\":\"%s\",\"mib\":%d,\"blocks_per_sm\":%d,"
        "\"buckets\":%d,\"median_ms\":%.4f,\"gbps\":%.1f,\"match\":%s}\n",
        name, mib, grid_per_sm, b == nullptr ? size_t{1} : b->size(), med,
        static_cast<double>(read_bytes) / (med * 1e6), ok ? "true" : "false");
    std::fflush(stdout);
    return ok;
  };
  bool all = true;
  for (int g : {1, 2, 4, 8, 16}) {
    all &= time_it(
        "chunk", g, bytes,
        [&](int blocks) { CHECK_CUDA(LaunchChunkHashSum(dev, bytes, sums, stream, blocks)); },
        nullptr, whole);
    for (const Case& c : cases) {
      if (c.name == "wire_odd") continue;  // the session 18 kernel: raw items only
      all &= time_it((c.name + "_session18").c_str(), g, bytes,
                     [&](int blocks) {
                       for (size_t i = 0; i < c.buckets.size(); ++i) {
                         CHECK_CUDA(bench::LaunchSession18WireHashSum(
                             c.buckets[i].view, c.buckets[i].bytes, sums + i, stream, blocks));
                       }
                     },
                     &c.buckets, c.want);
    }
    for (const Case& c : cases) {
      all &= time_it(
          c.name.c_str(), g, bytes,
          [&](int blocks) {
            for (size_t i = 0; i < c.buckets.size(); ++i) {
              CHECK_CUDA(LaunchWireHashSum(c.buckets[i].view, c.buckets[i].bytes, sums + i, stream,
                                           blocks));
            }
          },
          &c.buckets, c.want);
    }
  }
  for (const Case& c : cases) {
    for (const Uploaded& u : c.buckets) CHECK_CUDA(cudaFree(u.buffer));
  }
  CHECK_CUDA(cudaFree(sums_mem));
  CHECK_CUDA(cudaFree(dev_mem));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return all ? 0 : 1;
}

}  // namespace
}  // namespace wsync::cuda

int main(int argc, char** argv) { return wsync::cuda::Run(argc, argv); }
