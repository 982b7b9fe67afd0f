// Raw transfer patterns (issue 21 item 1): how fast the GPUs of one NVSwitch
// host move a given GPU-to-GPU byte matrix, by copy engines or SM kernels,
// under several issue strategies: every pair on a stream of its own, one
// stream per writer (in turn or interleaved), and matchings (a Birkhoff-von
// Neumann decomposition, with or without a cross-GPU barrier between them).
// The evidence for put phases (controller/plan/put_phases.h). One process,
// CUDA runtime only; prints one RESULT line per (pattern, strategy).
//   wsync_bench_pattern_probe [--patterns fanout_tp2,colocated4,...]
//       [--strategies ce_phased,...] [--chunk-mib 64] [--iters 5] [--blocks 32]
// bench/results/gpu-2026-11-28-session23.md has the figures on 4 x H200.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "exit_on_error.h"  // beside this file: nvcc builds it alone

#define CK(x) WSYNC_EXIT_ON_ERROR(x, cudaSuccess, cudaGetErrorString)

struct Flow {
  int src, dst;
  size_t bytes;
  size_t src_off = 0, dst_off = 0;
};

constexpr int kMaxDev = 8;
static int g_ndev = 4;
static size_t g_chunk = 64ull << 20;
static int g_iters = 5;
static int g_blocks = 32;

struct Bufs {
  char* src[kMaxDev] = {};
  char* dst[kMaxDev] = {};
  size_t src_bytes[kMaxDev] = {}, dst_bytes[kMaxDev] = {};
};

__global__ void CopyKernel(const int4* __restrict__ in, int4* __restrict__ out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) out[i] = in[i];
}

static void Layout(std::vector<Flow>& flows, Bufs& b) {
  size_t so[kMaxDev] = {}, dof[kMaxDev] = {};
  for (auto& f : flows) {
    f.src_off = so[f.src];
    so[f.src] += f.bytes;
    f.dst_off = dof[f.dst];
    dof[f.dst] += f.bytes;
  }
  for (int d = 0; d < g_ndev; ++d) {
    CK(cudaSetDevice(d));
    if (b.src[d]) CK(cudaFree(b.src[d]));
    if (b.dst[d]) CK(cudaFree(b.dst[d]));
    b.src[d] = b.dst[d] = nullptr;
    b.src_bytes[d] = so[d];
    b.dst_bytes[d] = dof[d];
    if (so[d]) {
      CK(cudaMalloc(&b.src[d], so[d]));
      CK(cudaMemset(b.src[d], d + 1, so[d]));
    }
    if (dof[d]) {
      CK(cudaMalloc(&b.dst[d], dof[d]));
      CK(cudaMemset(b.dst[d], 0, dof[d]));
    }
  }
  for (int d = 0; d < g_ndev; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceSynchronize());
  }
}

// A segment of a flow: bytes [off, off+len) of the flow.
struct Seg {
  int flow;
  size_t off, len;
};

struct Streams {
  std::vector<cudaStream_t> s[kMaxDev];
  cudaStream_t Get(int dev, int i) {
    CK(cudaSetDevice(dev));
    while ((int)s[dev].size() <= i) {
      cudaStream_t st;
      CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      s[dev].push_back(st);
    }
    return s[dev][i];
  }
};
static Streams g_streams;

static void IssueCopy(const Flow& f, const Bufs& b, size_t off, size_t len, cudaStream_t st,
                      bool kernel, int issuing_dev) {
  char* from = b.src[f.src] + f.src_off + off;
  char* to = b.dst[f.dst] + f.dst_off + off;
  CK(cudaSetDevice(issuing_dev));
  if (!kernel) {
    CK(cudaMemcpyAsync(to, from, len, cudaMemcpyDeviceToDevice, st));
  } else {
    CopyKernel<<<g_blocks, 512, 0, st>>>((const int4*)from, (int4*)to, len / sizeof(int4));
    CK(cudaGetLastError());
  }
}

static void IssueSegs(const std::vector<Flow>& flows, const Bufs& b, const std::vector<Seg>& segs,
                      cudaStream_t st, bool kernel, bool pull) {
  for (const Seg& s : segs) {
    const Flow& f = flows[s.flow];
    for (size_t o = 0; o < s.len; o += g_chunk) {
      size_t len = std::min(g_chunk, s.len - o);
      IssueCopy(f, b, s.off + o, len, st, kernel, pull ? f.dst : f.src);
    }
  }
}

static void SyncAll() {
  for (int d = 0; d < g_ndev; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceSynchronize());
  }
}

// Strategies. Each issues one whole pattern; the caller times it.
static void StreamPerFlow(const std::vector<Flow>& flows, const Bufs& b, bool kernel, bool pull) {
  int next[kMaxDev] = {};
  for (size_t i = 0; i < flows.size(); ++i) {
    int dev = pull ? flows[i].dst : flows[i].src;
    cudaStream_t st = g_streams.Get(dev, next[dev]++);
    IssueSegs(flows, b, {{(int)i, 0, flows[i].bytes}}, st, kernel, pull);
  }
}

static void OneStreamSequential(const std::vector<Flow>& flows, const Bufs& b) {
  for (size_t i = 0; i < flows.size(); ++i)
    IssueSegs(flows, b, {{(int)i, 0, flows[i].bytes}}, g_streams.Get(flows[i].src, 0), false,
              false);
}

// Per source: chunks interleaved in proportion to each flow's bytes, so all
// of a source's flows end together; `nstreams` streams per source, chunks
// dealt round robin over them.
static void Proportional(const std::vector<Flow>& flows, const Bufs& b, int nstreams) {
  for (int d = 0; d < g_ndev; ++d) {
    std::vector<int> mine;
    size_t total = 0;
    for (size_t i = 0; i < flows.size(); ++i)
      if (flows[i].src == d) mine.push_back((int)i), total += flows[i].bytes;
    if (mine.empty()) continue;
    std::vector<size_t> done(mine.size(), 0);
    size_t issued = 0;
    int k = 0;
    while (issued < total) {
      // the flow furthest behind its share
      int best = -1;
      double best_frac = 2;
      for (size_t j = 0; j < mine.size(); ++j) {
        const Flow& f = flows[mine[j]];
        if (done[j] >= f.bytes) continue;
        double frac = (double)done[j] / f.bytes;
        if (frac < best_frac) best_frac = frac, best = (int)j;
      }
      const Flow& f = flows[mine[best]];
      size_t len = std::min(g_chunk, f.bytes - done[best]);
      IssueCopy(f, b, done[best], len, g_streams.Get(d, k++ % nstreams), false, d);
      done[best] += len;
      issued += len;
    }
  }
}

// Phases of matchings (Birkhoff-von Neumann on the padded byte matrix): in
// each phase every GPU writes at most one peer and is written by at most
// one; all GPUs meet at a cross-device event barrier between phases.
struct Phase {
  std::vector<Seg> segs;  // at most one per source
};

static std::vector<Phase> Decompose(const std::vector<Flow>& flows) {
  int n = g_ndev;
  std::vector<std::vector<double>> real(n, std::vector<double>(n, 0)), pad;
  for (auto& f : flows) real[f.src][f.dst] += (double)f.bytes;
  std::vector<double> row(n, 0), col(n, 0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) row[i] += real[i][j], col[j] += real[i][j];
  double L = 0;
  for (int i = 0; i < n; ++i) L = std::max({L, row[i], col[i]});
  pad = real;
  // pad greedily to uniform sums L
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double add = std::min(L - row[i], L - col[j]);
      if (add > 0) pad[i][j] += add, row[i] += add, col[j] += add;
    }
  std::vector<double> rem(n);  // real bytes left per pair, as flow progress
  std::vector<std::vector<size_t>> sent(n, std::vector<size_t>(n, 0));
  std::vector<Phase> phases;
  std::vector<int> perm(n);
  for (int it = 0; it < 64; ++it) {
    for (int i = 0; i < n; ++i) perm[i] = i;
    double best_min = 0;
    std::vector<int> best;
    do {
      double m = 1e300;
      for (int i = 0; i < n; ++i) m = std::min(m, pad[i][perm[i]]);
      // prefer matchings carrying real bytes on the busiest ports
      double realsum = 0;
      for (int i = 0; i < n; ++i) realsum += real[i][perm[i]] > 0 ? 1 : 0;
      double score = m * (1 + 1e-3 * realsum);
      if (m > 1 && score > best_min) best_min = score, best = perm;
    } while (std::next_permutation(perm.begin(), perm.end()));
    if (best.empty()) break;
    double m = 1e300;
    for (int i = 0; i < n; ++i) m = std::min(m, pad[i][best[i]]);
    Phase ph;
    for (int i = 0; i < n; ++i) {
      int j = best[i];
      pad[i][j] -= m;
      double r = std::min(m, real[i][j]);
      if (i != j && r >= 1) {
        real[i][j] -= r;
        // map to the flow i->j (first flow with room)
        for (size_t fi = 0; fi < flows.size(); ++fi) {
          const Flow& f = flows[fi];
          if (f.src != i || f.dst != j) continue;
          size_t len = (size_t)r;
          len = std::min(len, f.bytes - sent[i][j]);
          if (real[i][j] < 1) len = f.bytes - sent[i][j];  // round-off
          if (len) ph.segs.push_back({(int)fi, sent[i][j], len});
          sent[i][j] += len;
          break;
        }
      }
    }
    if (!ph.segs.empty()) phases.push_back(ph);
  }
  return phases;
}

static void Phased(const std::vector<Flow>& flows, const Bufs& b, const std::vector<Phase>& phases,
                   bool kernel, bool barrier = true, int nstreams = 1) {
  static cudaEvent_t ev[kMaxDev];
  static bool made = false;
  if (!made) {
    for (int d = 0; d < g_ndev; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventCreateWithFlags(&ev[d], cudaEventDisableTiming));
    }
    made = true;
  }
  for (size_t p = 0; p < phases.size(); ++p) {
    for (const Seg& s : phases[p].segs) {
      int d = flows[s.flow].src;
      if (nstreams == 1) {
        IssueSegs(flows, b, {s}, g_streams.Get(d, 0), kernel, false);
        continue;
      }
      // fork: streams 1..n wait on stream 0, chunks dealt round robin, join
      static cudaEvent_t fork[kMaxDev], join[kMaxDev][8];
      static bool made2 = false;
      if (!made2) {
        for (int x = 0; x < g_ndev; ++x) {
          CK(cudaSetDevice(x));
          CK(cudaEventCreateWithFlags(&fork[x], cudaEventDisableTiming));
          for (int k = 0; k < 8; ++k)
            CK(cudaEventCreateWithFlags(&join[x][k], cudaEventDisableTiming));
        }
        made2 = true;
      }
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(fork[d], g_streams.Get(d, 0)));
      for (int k = 1; k < nstreams; ++k) CK(cudaStreamWaitEvent(g_streams.Get(d, k), fork[d], 0));
      int k = 0;
      for (size_t o = 0; o < s.len; o += g_chunk, ++k) {
        size_t len = std::min(g_chunk, s.len - o);
        IssueCopy(flows[s.flow], b, s.off + o, len, g_streams.Get(d, k % nstreams), kernel, d);
      }
      for (int k = 1; k < nstreams; ++k) {
        CK(cudaSetDevice(d));
        CK(cudaEventRecord(join[d][k], g_streams.Get(d, k)));
        CK(cudaStreamWaitEvent(g_streams.Get(d, 0), join[d][k], 0));
      }
    }
    if (p + 1 == phases.size() || !barrier) continue;
    for (int d = 0; d < g_ndev; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(ev[d], g_streams.Get(d, 0)));
    }
    for (int d = 0; d < g_ndev; ++d)
      for (int e = 0; e < g_ndev; ++e)
        if (d != e) {
          CK(cudaSetDevice(d));
          CK(cudaStreamWaitEvent(g_streams.Get(d, 0), ev[e], 0));
        }
  }
}

static double Busiest(const std::vector<Flow>& flows) {
  double in[kMaxDev] = {}, out[kMaxDev] = {}, m = 0;
  for (auto& f : flows) out[f.src] += f.bytes, in[f.dst] += f.bytes;
  for (int d = 0; d < g_ndev; ++d) m = std::max({m, in[d], out[d]});
  return m;
}

template <typename F>
static void Time(const char* pattern, const char* strategy, const std::vector<Flow>& flows,
                 F issue) {
  std::vector<double> t;
  for (int it = 0; it < g_iters + 1; ++it) {
    SyncAll();
    auto t0 = std::chrono::steady_clock::now();
    issue();
    SyncAll();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it) t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  double med = t[t.size() / 2];
  double busy = Busiest(flows);
  printf(
      "RESULT {\"bench\":\"pattern_probe\",\"pattern\":\"%s\",\"strategy\":\"%s\","
      "\"chunk_mib\":%zu,\"median_ms\":%.3f,\"min_ms\":%.3f,\"busiest_gb\":%.4f,"
      "\"busiest_gbps\":%.1f}\n",
      pattern, strategy, g_chunk >> 20, med * 1e3, t[0] * 1e3, busy / 1e9, busy / med / 1e9);
  fflush(stdout);
}

static std::vector<Flow> Pattern(const std::string& name) {
  const size_t G8 = 8030527488ull / 1;  // one TP2 shard of Llama-3-8B
  if (name == "pair") return {{0, 1, 2 * G8}};
  if (name == "bidir") return {{0, 1, 2 * G8}, {1, 0, 2 * G8}};
  if (name == "dp2") return {{0, 2, 2 * G8}, {1, 3, 2 * G8}};
  if (name == "fanout_tp2") return {{0, 2, G8}, {0, 3, G8}, {1, 2, G8}, {1, 3, G8}};
  if (name == "one_to_two") return {{0, 1, G8}, {0, 2, G8}};
  if (name == "two_to_one") return {{0, 2, G8}, {1, 2, G8}};
  if (name == "colocated4") {
    const size_t S = 604112896ull, B = 3411150848ull;
    return {{0, 1, S}, {0, 2, B}, {0, 3, S}, {1, 0, B}, {1, 2, B}, {1, 3, S},
            {2, 0, S}, {2, 1, B}, {2, 3, B}, {3, 0, S}, {3, 1, B}, {3, 2, S}};
  }
  if (name == "alltoall") {
    std::vector<Flow> f;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (i != j) f.push_back({i, j, 2476000000ull});
    return f;
  }
  fprintf(stderr, "unknown pattern %s\n", name.c_str());
  exit(2);
}

int main(int argc, char** argv) {
  std::vector<std::string> patterns = {"pair",       "bidir",      "dp2",        "one_to_two",
                                       "two_to_one", "fanout_tp2", "colocated4", "alltoall"};
  std::string strategies = "all";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--chunk-mib")
      g_chunk = std::stoull(argv[++i]) << 20;
    else if (a == "--iters")
      g_iters = std::stoi(argv[++i]);
    else if (a == "--blocks")
      g_blocks = std::stoi(argv[++i]);
    else if (a == "--strategies")
      strategies = argv[++i];
    else if (a == "--patterns") {
      patterns.clear();
      std::string s = argv[++i];
      size_t p = 0;
      while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        patterns.push_back(s.substr(p, q - p));
        p = q + 1;
      }
    }
  }
  CK(cudaGetDeviceCount(&g_ndev));
  g_ndev = std::min(g_ndev, kMaxDev);
  for (int d = 0; d < g_ndev; ++d) {
    CK(cudaSetDevice(d));
    for (int e = 0; e < g_ndev; ++e)
      if (d != e) {
        cudaError_t r = cudaDeviceEnablePeerAccess(e, 0);
        if (r != cudaSuccess && r != cudaErrorPeerAccessAlreadyEnabled) CK(r);
      }
  }
  Bufs b;
  auto want = [&](const char* s) {
    return strategies == "all" || strategies.find(s) != std::string::npos;
  };
  for (const auto& p : patterns) {
    std::vector<Flow> flows = Pattern(p);
    int need = 0;
    for (auto& f : flows) need = std::max({need, f.src + 1, f.dst + 1});
    if (need > g_ndev) continue;
    Layout(flows, b);
    auto phases = Decompose(flows);
    fprintf(stderr, "%s: %zu phases\n", p.c_str(), phases.size());
    if (want("ce_stream_per_flow"))
      Time(p.c_str(), "ce_stream_per_flow", flows, [&] { StreamPerFlow(flows, b, false, false); });
    if (want("ce_pull_per_flow"))
      Time(p.c_str(), "ce_pull_per_flow", flows, [&] { StreamPerFlow(flows, b, false, true); });
    if (want("ce_one_stream_seq"))
      Time(p.c_str(), "ce_one_stream_seq", flows, [&] { OneStreamSequential(flows, b); });
    if (want("ce_proportional_1"))
      Time(p.c_str(), "ce_proportional_1", flows, [&] { Proportional(flows, b, 1); });
    if (want("ce_proportional_4"))
      Time(p.c_str(), "ce_proportional_4", flows, [&] { Proportional(flows, b, 4); });
    if (want("ce_phased"))
      Time(p.c_str(), "ce_phased", flows, [&] { Phased(flows, b, phases, false); });
    if (want("ce_phased_nobarrier"))
      Time(p.c_str(), "ce_phased_nobarrier", flows,
           [&] { Phased(flows, b, phases, false, false, 1); });
    if (want("ce_phased_4streams"))
      Time(p.c_str(), "ce_phased_4streams", flows,
           [&] { Phased(flows, b, phases, false, true, 4); });
    if (want("ce_phased_nobarrier_4streams"))
      Time(p.c_str(), "ce_phased_nobarrier_4streams", flows,
           [&] { Phased(flows, b, phases, false, false, 4); });
    if (want("sm_stream_per_flow"))
      Time(p.c_str(), "sm_stream_per_flow", flows, [&] { StreamPerFlow(flows, b, true, false); });
    if (want("sm_phased"))
      Time(p.c_str(), "sm_phased", flows, [&] { Phased(flows, b, phases, true); });
  }
  return 0;
}
