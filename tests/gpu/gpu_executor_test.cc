// End to end on two GPUs: plans from BuildPlan (catalog models and a
// hand-made partial-sum spec) run by the shared Executor over CudaDataOps +
// NcclTransport, one thread and device per worker; every destination buffer
// must equal, bit for bit, what the host path (HostDataOps + Gloo, the
// reference) writes from the same source bytes under the same plan.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "catalog/case.h"
#include "common/cast.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/planner.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/worker/exec/cluster.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/exec/executor.h"
#include "worker/node/data_plane.h"
#include "worker/plane/kv_store.h"

namespace wsync {
namespace {

using exec::BufferSide;

struct BufferSpec {
  int32_t worker;
  BufferSide side;
  std::string name;
  DType dtype;
  int64_t bytes;
};

// Every (worker, side, buffer) the spec's fragments touch, sized to fit.
std::vector<BufferSpec> Buffers(const v1::TransferSpec& spec) {
  std::map<std::tuple<int32_t, int, std::string>, BufferSpec> out;
  for (auto [side, role, bside] :
       {std::tuple{&spec.source(), plan::SideRole::kSource, BufferSide::kSource},
        std::tuple{&spec.destination(), plan::SideRole::kDestination, BufferSide::kDestination}}) {
    auto compiled = plan::CompileSide(*side, role);
    EXPECT_TRUE(compiled.ok()) << compiled.status();
    if (!compiled.ok()) return {};
    for (const auto& t : compiled->tensors) {
      for (const auto& f : t.fragments()) {
        if (f.box.Empty()) continue;
        int64_t last = 0;
        for (size_t d = 0; d < f.strides.size(); ++d) last += (f.box.length[d] - 1) * f.strides[d];
        const int32_t worker = side->ranks(f.rank).worker();
        const std::string& name = compiled->buffer_names[t.buffer(f)];
        BufferSpec& b = out[{worker, static_cast<int>(bside), name}];
        b = {worker, bside, name, b.bytes ? b.dtype : t.dtype,
             std::max(b.bytes, f.byte_offset + (last + 1) * DTypeSize(t.dtype))};
      }
    }
  }
  std::vector<BufferSpec> v;
  for (auto& [k, b] : out) v.push_back(b);
  return v;
}

// Finite values of `dtype` (NaN sums are not bitwise portable).
std::vector<uint8_t> FiniteBytes(DType dtype, int64_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  const int64_t n = bytes / DTypeSize(dtype);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> val(-3.f, 3.f);
  std::vector<float> f(n);
  for (auto& x : f) x = val(rng);
  EXPECT_TRUE(ConvertElements(f.data(), v1::FP32, out.data(), dtype, n).ok());
  return out;
}

class GpuCluster {
 public:
  GpuCluster(const v1::TransferSpec& spec, int n) : n_(n), host_(n), workers_(n) {
    uint32_t seed = 1;
    for (const BufferSpec& b : Buffers(spec)) {
      std::vector<uint8_t> init = b.side == BufferSide::kSource
                                      ? FiniteBytes(b.dtype, b.bytes, seed++)
                                      : std::vector<uint8_t>(b.bytes, exec::testing::kSentinel);
      auto& h = host_.Add(b.worker, b.side, b.name, b.dtype, b.bytes / DTypeSize(b.dtype));
      std::memcpy(h.data(), init.data(), b.bytes);
      auto dev = cuda::DeviceBuffer::Allocate(b.worker, b.bytes);
      EXPECT_TRUE(dev.ok()) << dev.status();
      cuda::DeviceGuard g(b.worker);
      EXPECT_EQ(cudaMemcpy(dev->data(), init.data(), b.bytes, cudaMemcpyHostToDevice), cudaSuccess);
      exec::RegisteredBuffer r{dev->data(), b.bytes, b.dtype, transport::MemorySpace::kCuda};
      EXPECT_TRUE(workers_[b.worker].registry.Register(b.side, b.name, r).ok());
      if (b.side == BufferSide::kDestination) dst_.push_back(b);
      workers_[b.worker].memory.push_back(std::move(*dev));
    }
  }

  absl::Status Connect() {
    static int generation = 0;
    const std::string prefix = absl::StrCat("gpu-exec-", generation++);
    std::vector<absl::Status> st(n_);
    std::vector<std::thread> threads;
    for (int w = 0; w < n_; ++w) {
      threads.emplace_back([&, w] {
        Worker& wk = workers_[w];
        if (wk.plane == nullptr) {
          auto backend = cuda::CudaBackend::Create(w, {});
          st[w] = backend.status();
          if (!backend.ok()) return;
          wk.backend = std::move(*backend);
          wk.plane = std::make_unique<node::DataPlane>(wk.backend.get(), exec::ExecutorOptions());
        }
        // A rebuilt group replaces the old communicator: abort it (its peer
        // may be gone) rather than wait for a clean finalize. The channel
        // (data ops and executor too) is built afresh, as the worker agent
        // does.
        if (wk.channel) wk.channel->transport->Abort("reconnect");
        wk.channel.reset();
        plane::ConnectOptions o;
        o.store = &store_;
        o.prefix = prefix;
        o.rank = w;
        o.size = n_;
        o.deadline = absl::Now() + absl::Seconds(120);
        auto ch = wk.plane->Connect(o);
        st[w] = ch.status();
        if (ch.ok()) wk.channel = std::move(*ch);
      });
    }
    for (auto& t : threads) t.join();
    for (auto& s : st) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::vector<absl::StatusOr<exec::SyncStats>> Run(const v1::Plan& plan, absl::Duration timeout,
                                                   const std::set<int>& silent = {}) {
    std::vector<absl::StatusOr<exec::SyncStats>> out(n_, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < n_; ++w) {
      if (silent.count(w)) continue;
      threads.emplace_back([&, w] {
        Worker& wk = workers_[w];
        auto bound = exec::BindPlan(plan, w, wk.registry, transport::MemorySpace::kCuda);
        if (!bound.ok()) {
          out[w] = bound.status();
          return;
        }
        out[w] =
            wk.channel->executor->Run(**bound, wk.registry.generation(), absl::Now() + timeout);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  // Runs the plan on the host reference and compares every destination buffer.
  void ExpectMatchesHost(const v1::Plan& plan) {
    ASSERT_TRUE(host_.Connect().ok());
    for (auto& r : host_.Run(plan, absl::Seconds(60))) ASSERT_TRUE(r.ok()) << r.status();
    for (const BufferSpec& b : dst_) {
      std::vector<uint8_t> got(b.bytes);
      const exec::RegisteredBuffer* r = workers_[b.worker].registry.Find(b.side, b.name);
      cuda::DeviceGuard g(b.worker);
      ASSERT_EQ(cudaMemcpy(got.data(), r->data, b.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      const uint8_t* want = host_.Data<uint8_t>(b.worker, b.side, b.name);
      const int64_t diff = testing::FirstDiff(got, std::vector<uint8_t>(want, want + b.bytes));
      EXPECT_EQ(diff, -1) << "worker " << b.worker << " buffer " << b.name;
    }
  }

  // The data ops of worker w's channel (the CUDA backend's).
  cuda::CudaDataOps& ops(int w) {
    return static_cast<cuda::CudaDataOps&>(*workers_[w].channel->ops);
  }

 private:
  struct Worker {
    exec::BufferRegistry registry;
    std::vector<cuda::DeviceBuffer> memory;
    std::unique_ptr<cuda::CudaBackend> backend;
    std::unique_ptr<node::DataPlane> plane;
    std::unique_ptr<node::Channel> channel;
  };
  const int n_;
  exec::testing::Cluster host_;
  transport::InMemoryKvStore store_;
  std::vector<Worker> workers_;
  std::vector<BufferSpec> dst_;
};

v1::TransferSpec CatalogSpec(const std::string& model, int shards, int tp, bool colocated,
                             v1::DType trainer = v1::BF16) {
  catalog::CaseOptions o;
  o.model = model;
  o.source.shards = shards;
  o.destination.tp = tp;
  o.colocated = colocated;
  o.trainer_dtype = trainer;
  auto spec = catalog::BuildCase(o);
  EXPECT_TRUE(spec.ok()) << spec.status();
  for (auto* side : {spec->mutable_source(), spec->mutable_destination()}) {
    for (auto& r : *side->mutable_ranks()) r.set_node("node0");
  }
  return *spec;
}

void RunAndCompare(const v1::TransferSpec& spec, int min_rounds = 1) {
  auto plan = plan::BuildPlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GE(plan->num_rounds(), min_rounds);
  GpuCluster c(spec, 2);
  ASSERT_TRUE(c.Connect().ok());
  for (auto& r : c.Run(*plan, absl::Seconds(60))) ASSERT_TRUE(r.ok()) << r.status();
  c.ExpectMatchesHost(*plan);
}

class GpuExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { WSYNC_REQUIRE_GPUS(2); }
};

TEST_F(GpuExecutorTest, OneGpuToOneGpu) { RunAndCompare(CatalogSpec("tiny-llama", 1, 1, false)); }

TEST_F(GpuExecutorTest, ColocatedSelfCopiesAndFusedQkvGateUp) {
  RunAndCompare(CatalogSpec("tiny-llama", 2, 2, true));
}

TEST_F(GpuExecutorTest, MoeExpertsColocated) {
  RunAndCompare(CatalogSpec("tiny-qwen3-moe", 2, 2, true));
}

TEST_F(GpuExecutorTest, Fp32TrainerToBf16) {
  RunAndCompare(CatalogSpec("tiny-llama", 1, 1, false, v1::FP32));
  RunAndCompare(CatalogSpec("tiny-llama", 2, 2, true, v1::FP32));
}

TEST_F(GpuExecutorTest, TinyStagingCapForcesManyRounds) {
  v1::TransferSpec spec = CatalogSpec("tiny-qwen3-moe", 1, 1, false);
  spec.mutable_options()->set_bucket_bytes(4096);
  spec.mutable_options()->set_staging_cap_bytes(8192);
  spec.mutable_options()->set_zero_copy_min_bytes(int64_t{1} << 40);
  // The cap forces 8+ rounds (the planner packs them into 9 since its round
  // local search; 10 before).
  RunAndCompare(spec, 8);
}

TEST_F(GpuExecutorTest, PartialSumReducedThenCast) {
  // Two trainer ranks hold partial fp32 sums of w; vLLM TP=2 wants bf16
  // column shards (strided) of the reduced tensor, on the same two GPUs.
  v1::TransferSpec spec;
  for (auto* side : {spec.mutable_source(), spec.mutable_destination()}) {
    for (int w = 0; w < 2; ++w) {
      auto* r = side->add_ranks();
      r->set_worker(w);
      r->set_node("node0");
    }
  }
  auto* s = spec.mutable_source()->add_tensors();
  s->set_name("w");
  s->set_dtype(v1::FP32);
  s->add_shape(64);
  s->add_shape(48);
  s->mutable_mesh()->add_mesh_shape(2);
  s->mutable_mesh()->add_ranks(0);
  s->mutable_mesh()->add_ranks(1);
  s->mutable_mesh()->add_placements()->mutable_partial()->set_op(v1::REDUCE_SUM);
  auto* d = spec.mutable_destination()->add_tensors();
  *d = *s;
  d->set_dtype(v1::BF16);
  d->mutable_mesh()->clear_placements();
  d->mutable_mesh()->add_placements()->mutable_shard()->set_dim(1);
  auto* cast = spec.mutable_options()->add_allowed_casts();
  cast->set_from(v1::FP32);
  cast->set_to(v1::BF16);
  auto plan = plan::BuildPlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->reduces_size(), 0);
  GpuCluster c(spec, 2);
  ASSERT_TRUE(c.Connect().ok());
  for (auto& r : c.Run(*plan, absl::Seconds(60))) ASSERT_TRUE(r.ok()) << r.status();
  c.ExpectMatchesHost(*plan);
}

TEST_F(GpuExecutorTest, AbortedSyncThenSuccessfulSync) {
  const v1::TransferSpec spec = CatalogSpec("tiny-llama", 1, 1, false);
  auto plan = plan::BuildPlan(spec);
  ASSERT_TRUE(plan.ok());
  GpuCluster c(spec, 2);
  ASSERT_TRUE(c.Connect().ok());
  // Worker 1 never shows up: worker 0 fails at its deadline, not later.
  const absl::Time start = absl::Now();
  auto failed = c.Run(*plan, absl::Seconds(2), {1});
  EXPECT_FALSE(failed[0].ok());
  EXPECT_EQ(failed[0].status().code(), absl::StatusCode::kDeadlineExceeded) << failed[0].status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  // New communicator and executors (as the worker agent does), same buffers.
  ASSERT_TRUE(c.Connect().ok());
  for (auto& r : c.Run(*plan, absl::Seconds(60))) ASSERT_TRUE(r.ok()) << r.status();
  c.ExpectMatchesHost(*plan);
}

TEST_F(GpuExecutorTest, SteadyStateReplaysResidentTables) {
  const v1::TransferSpec spec = CatalogSpec("tiny-qwen3-moe", 2, 2, true);
  auto plan = plan::BuildPlan(spec);
  ASSERT_TRUE(plan.ok());
  GpuCluster c(spec, 2);
  ASSERT_TRUE(c.Connect().ok());
  for (int i = 0; i < 3; ++i) {
    for (auto& r : c.Run(*plan, absl::Seconds(60))) ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_GT(c.ops(0).table_cache_hits(), 0);
  c.ExpectMatchesHost(*plan);
}

}  // namespace
}  // namespace wsync
