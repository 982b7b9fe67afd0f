// The pipelined executor's test plans and fixture (pipelined_executor_test.cc,
// pipelined_staging_test.cc): three workers over Gloo on loopback with lazy
// data ops, a 16-round plan with relays (staged and zero-copy), local copies,
// local and mixed reduces, and the bytes every destination must end with.
#ifndef WSYNC_TESTS_WORKER_EXEC_PIPELINED_FIXTURE_H_
#define WSYNC_TESTS_WORKER_EXEC_PIPELINED_FIXTURE_H_

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "worker/exec/pipeline_schedule.h"

namespace wsync::exec::testing {

constexpr int kWorkers = 3;
constexpr int64_t kSrcNumel = 4096;
constexpr int64_t kDstNumel = 32768;

inline float SrcValue(int w, int64_t i) { return static_cast<float>(w * 100000 + i); }

inline v1::TensorView View(int w, bool dst, int64_t off, int64_t n, int64_t stride) {
  v1::TensorView v;
  v.set_buffer_name(dst ? kWorkers + w : w);  // names: s0.., then d0..
  v.set_side(dst ? v1::DESTINATION_BUFFER : v1::SOURCE_BUFFER);
  v.set_byte_offset(off * 4);
  v.add_shape(n);
  v.add_strides(stride);
  v.set_dtype(v1::FP32);
  return v;
}

struct PieceSpec {
  v1::TensorView src, dst;
  int64_t reduce_id = 0;
  bool relay = false;
};

// Builds a plan and the values every destination element must end with.
class PlanGen {
 public:
  explicit PlanGen(uint32_t seed) : rng_(seed), expect_(kWorkers) {
    for (auto& e : expect_) e.assign(kDstNumel, 0.0f);
    written_.assign(kWorkers, std::vector<bool>(kDstNumel, false));
    cursor_.assign(kWorkers, 0);
  }

  // A fresh piece from w's source (stride `stride`) into a new region of v's
  // destination (dst_off < 0) or the given one.
  PieceSpec Fresh(int w, int v, int64_t n, int64_t stride, int64_t* dst_off = nullptr) {
    std::uniform_int_distribution<int64_t> d(0, kSrcNumel - 1 - (n - 1) * stride);
    const int64_t off = d(rng_);
    const int64_t at = Claim(v, n);
    for (int64_t k = 0; k < n; ++k) Set(v, at + k, SrcValue(w, off + k * stride));
    if (dst_off) *dst_off = at;
    return {View(w, false, off, n, stride), View(v, true, at, n, 1)};
  }
  // Re-sends v's destination region [a, a + n) (received earlier) to u.
  PieceSpec Relay(int v, int64_t a, int64_t n, int u, int64_t* dst_off = nullptr) {
    const int64_t at = Claim(u, n);
    for (int64_t k = 0; k < n; ++k) Set(u, at + k, expect_[v][a + k]);
    if (dst_off) *dst_off = at;
    PieceSpec p{View(v, true, a, n, 1), View(u, true, at, n, 1)};
    p.relay = true;
    return p;
  }

  int64_t Bucket(int s, int r, int round, bool zero_copy, std::vector<PieceSpec> pieces) {
    v1::Bucket* b = plan_.add_buckets();
    b->set_id(plan_.buckets_size() - 1);
    b->set_sender(s);
    b->set_receiver(r);
    b->set_round(round);
    b->set_transport(s == r ? v1::TRANSPORT_LOCAL : v1::TRANSPORT_NETWORK);
    b->set_zero_copy(zero_copy);
    b->set_seq(seq_[{s, r, round}]++);
    int64_t bytes = 0;
    for (const PieceSpec& ps : pieces) {
      v1::Piece* p = b->add_pieces();
      p->set_tensor_name(2 * kWorkers);  // "t"
      *p->mutable_src() = ps.src;
      *p->mutable_dst() = ps.dst;
      p->set_bucket_offset(bytes);
      p->set_wire_dtype(v1::FP32);
      p->set_reduce_id(ps.reduce_id);
      p->set_relay(ps.relay);
      bytes += ps.src.shape(0) * 4;
    }
    b->set_bytes(bytes);
    auto op = [&](int w, v1::Op::Kind kind, int peer) {
      v1::Op o;
      o.set_kind(kind);
      o.set_peer(peer);
      o.set_bucket(b->id());
      ops_[{w, round}].push_back(o);
    };
    if (s == r) {
      op(s, v1::Op::COPY, s);
    } else {
      op(s, v1::Op::SEND, r);
      op(r, v1::Op::RECV, s);
      if (!zero_copy) {
        staging_[{s, round}] += bytes;
        staging_[{r, round}] += bytes;
      }
    }
    return b->id();
  }

  // A SUM reduce on w into a new region of n elements: one partial from
  // each (sender, source offset) in `from` (sender == w: a local partial).
  void Reduce(int w, int round, int64_t n, const std::vector<int>& from) {
    const int64_t at = Claim(w, n);
    const int64_t id = plan_.reduces_size() + 1;
    v1::Reduce* r = plan_.add_reduces();
    r->set_id(id);
    r->set_worker(w);
    r->set_round(round);
    r->set_op(v1::REDUCE_SUM);
    r->set_accumulate_dtype(v1::FP32);
    *r->mutable_dst() = View(w, true, at, n, 1);
    std::vector<float> sum(n, 0.0f);
    for (int s : from) {
      std::uniform_int_distribution<int64_t> d(0, kSrcNumel - n);
      const int64_t off = d(rng_);
      for (int64_t k = 0; k < n; ++k) sum[k] += SrcValue(s, off + k);
      PieceSpec p{View(s, false, off, n, 1), View(w, true, at, n, 1)};
      p.reduce_id = id;
      v1::ReduceInput* in = r->add_inputs();
      in->set_bucket(Bucket(s, w, round, false, {p}));
      in->set_piece(0);
    }
    for (int64_t k = 0; k < n; ++k) Set(w, at + k, sum[k]);
    v1::Op o;
    o.set_kind(v1::Op::REDUCE);
    o.set_reduce(id);
    reduce_ops_[{w, round}].push_back(o);
  }

  v1::Plan Build(int num_rounds) {
    plan_.set_key(absl::StrCat("pipelined-", plan_.buckets_size()));
    plan_.clear_names();
    for (int w = 0; w < kWorkers; ++w) plan_.add_names(absl::StrCat("s", w));
    for (int w = 0; w < kWorkers; ++w) plan_.add_names(absl::StrCat("d", w));
    plan_.add_names("t");
    plan_.set_num_rounds(num_rounds);
    for (int w = 0; w < kWorkers; ++w) {
      v1::RankPlan* rp = plan_.add_ranks();
      rp->set_worker(w);
      for (int round = 0; round < num_rounds; ++round) {
        auto& ops = ops_[{w, round}];
        auto& red = reduce_ops_[{w, round}];
        if (ops.empty() && red.empty()) continue;
        v1::Round* r = rp->add_rounds();
        r->set_index(round);
        r->set_staging_bytes(staging_[{w, round}]);  // exactly the round's buckets
        for (const auto& o : ops) *r->add_ops() = o;
        for (const auto& o : red) *r->add_ops() = o;
      }
    }
    return plan_;
  }

  const std::vector<float>& expect(int w) const { return expect_[w]; }
  bool written(int w, int64_t i) const { return written_[w][i]; }

 private:
  int64_t Claim(int w, int64_t n) {
    const int64_t at = cursor_[w];
    cursor_[w] += n + 3;  // gaps stay sentinel: checks stray writes
    EXPECT_LE(cursor_[w], kDstNumel);
    return at;
  }
  void Set(int w, int64_t i, float v) {
    expect_[w][i] = v;
    written_[w][i] = true;
  }

  std::mt19937 rng_;
  v1::Plan plan_;
  std::vector<std::vector<float>> expect_;
  std::vector<std::vector<bool>> written_;
  std::vector<int64_t> cursor_;
  std::map<std::tuple<int, int, int>, int> seq_;
  std::map<std::pair<int, int>, std::vector<v1::Op>> ops_, reduce_ops_;
  std::map<std::pair<int, int>, int64_t> staging_;
};

constexpr int kRounds = 16;

// Rounds of staged sends to both peers, zero-copy sends, relays of what the
// previous round received (every 4th round; rounds 3 and 11 zero-copy),
// local copies, local-only and mixed reduces.
inline v1::Plan MakePlan(PlanGen& g) {
  struct Received {
    int v;
    int64_t off, n;
    bool zero_copy;
  };
  std::vector<Received> prev;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Received> now;
    for (int w = 0; w < kWorkers; ++w) {
      const int v = (w + 1) % kWorkers, u = (w + 2) % kWorkers;
      int64_t at = 0;
      PieceSpec a = g.Fresh(w, v, 37 + round, 1, &at);
      g.Bucket(w, v, round, false, {a, g.Fresh(w, v, 20, 3)});
      now.push_back({v, at, 37 + round, false});
      g.Bucket(w, u, round, false, {g.Fresh(w, u, 11 + round, 2)});
      if (round % 3 == 1) {
        g.Bucket(w, v, round, true, {g.Fresh(w, v, 64, 1, &at)});
        now.push_back({v, at, 64, true});
      }
      g.Bucket(w, w, round, false, {g.Fresh(w, w, 50, 1), g.Fresh(w, w, 17, 5)});
      if (round % 2 == 0) g.Reduce(w, round, 23, {w, u});
      if (round % 3 == 0) g.Reduce(w, round, 19, {w, w});
    }
    if (round % 4 == 2) {
      for (const Received& r : prev) {
        const int to = (r.v + 1) % kWorkers;
        if (r.zero_copy) {
          g.Bucket(r.v, to, round, true, {g.Relay(r.v, r.off, r.n, to)});
        } else {
          g.Bucket(r.v, to, round, false, {g.Relay(r.v, r.off, r.n, to)});
        }
      }
    }
    // Rounds 3 and 11 send what the round before unpacked straight from the
    // tensor (nothing else in them waits for that unpack).
    if (round % 8 == 3) {
      for (const Received& r : prev) {
        if (r.zero_copy) continue;
        const int other = (r.v + 2) % kWorkers;
        g.Bucket(r.v, other, round, true, {g.Relay(r.v, r.off, r.n, other)});
      }
    }
    prev = now;
  }
  return g.Build(kRounds);
}

class PipelinedExecutorTest : public ::testing::Test {
 protected:
  void SetUpCluster(ExecutorOptions options) {
    for (int w = 0; w < kWorkers; ++w) {
      cluster_.Add(w, BufferSide::kSource, absl::StrCat("s", w), v1::FP32, kSrcNumel);
      cluster_.Add(w, BufferSide::kDestination, absl::StrCat("d", w), v1::FP32, kDstNumel);
      float* s = cluster_.Data<float>(w, BufferSide::kSource, absl::StrCat("s", w));
      for (int64_t i = 0; i < kSrcNumel; ++i) s[i] = SrcValue(w, i);
    }
    ASSERT_TRUE(cluster_.Connect(options).ok());
  }
  void ClearDestinations() {
    for (int w = 0; w < kWorkers; ++w) {
      std::memset(cluster_.Data<uint8_t>(w, BufferSide::kDestination, absl::StrCat("d", w)),
                  kSentinel, kDstNumel * 4);
    }
  }
  void CheckDestinations(const PlanGen& g) {
    for (int w = 0; w < kWorkers; ++w) {
      const uint8_t* d = cluster_.Data<uint8_t>(w, BufferSide::kDestination, absl::StrCat("d", w));
      int bad = 0;
      for (int64_t i = 0; i < kDstNumel && bad < 5; ++i) {
        if (g.written(w, i)) {
          float got;
          std::memcpy(&got, d + i * 4, 4);
          if (got != g.expect(w)[i]) {
            ++bad;
            ADD_FAILURE() << "worker " << w << " element " << i << ": " << got
                          << " != " << g.expect(w)[i];
          }
        } else {
          for (int k = 0; k < 4; ++k) {
            if (d[i * 4 + k] != kSentinel) {
              ++bad;
              ADD_FAILURE() << "worker " << w << " unwritten element " << i << " was written";
              break;
            }
          }
        }
      }
    }
  }

  // Runs `plan` on every worker while a second thread samples each worker's
  // staging in use; *peak gets the largest value seen per worker.
  std::vector<absl::StatusOr<SyncStats>> RunSampled(const v1::Plan& plan,
                                                    std::vector<int64_t>* peak) {
    std::vector<std::atomic<int64_t>> sampled(kWorkers);
    for (auto& x : sampled) x.store(0);
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done.load()) {
        for (int w = 0; w < kWorkers; ++w) {
          const int64_t c = cluster_.executor(w).current_staging_bytes();
          if (c > sampled[w].load()) sampled[w].store(c);
        }
      }
    });
    auto out = cluster_.Run(plan, absl::Seconds(60));
    done.store(true);
    sampler.join();
    peak->clear();
    for (auto& x : sampled) peak->push_back(x.load());
    return out;
  }

  // Lazy data ops: whatever the executor leaves running runs as late as it
  // could, so an unsafe overlap gives wrong bytes.
  Cluster cluster_{kWorkers, /*lazy_ops=*/true};
};

// Rounds whose unpack must finish before the next round starts: those before
// a relay round (1, 5, 9, 13: the relays are packed from what they unpacked),
// 2 and 10 (rounds 3 and 11 send what they unpacked, zero-copy) and the last.
inline bool FinishesAsync(int round) {
  return round % 4 != 1 && round != 2 && round != 10 && round != kRounds - 1;
}

// The largest staging of two consecutive rounds of worker w's binding.
inline int64_t TwoRoundPeak(const BoundPlan& b) {
  int64_t peak = 0;
  for (size_t i = 0; i < b.rounds.size(); ++i) {
    peak = std::max(peak, b.rounds[i].staging_bytes +
                              (i + 1 < b.rounds.size() ? b.rounds[i + 1].staging_bytes : 0));
  }
  return peak;
}

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_PIPELINED_FIXTURE_H_
