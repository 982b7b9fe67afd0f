// Swap commits through ShadowSet over the host backend's memfd arenas
// (tests/worker/agent/shadow_swap_suite.h), and swaps that fail midway
// (a test-side arena that injects the failure).
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tests/worker/agent/shadow_swap_suite.h"
#include "tests/worker/agent/test_assignment.h"
#include "worker/agent/sync_runner.h"
#include "worker/agent/tensor_table.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

class HostSwap : public ShadowSwapFactory {
 public:
  std::string Name() const override { return "Host"; }
  plane::Backend& backend() override { return backend_; }
  transport::MemorySpace space() const override { return transport::MemorySpace::kHost; }

 private:
  host::HostBackend backend_{plane::BackendConfig()};
};

INSTANTIATE_TEST_SUITE_P(Host, ShadowSwapTest, ::testing::Values(std::make_shared<HostSwap>()),
                         ShadowSwapTest::ParamName);

// How the next swap of a FaultyArena fails (then it swaps normally again).
enum class SwapFault {
  kNone,
  // BeginSwap: the memory was exchanged, then a later step failed and the
  // swap put each range back on its own memory (the seam's contract on
  // error).
  kMidwayPutBack,
  // BeginSwap: the memory was exchanged, then a later step failed and
  // putting it back failed too: the live range is left inaccessible
  // (PROT_NONE stands for the unmapped range a failed MAP_FIXED / cuMemMap
  // leaves).
  kMidwayLost,
  // FinishSwap: remapping the twin's range fails and leaves it
  // inaccessible (the live range already serves the new memory).
  kFinishFails,
};

// A host arena whose swap fails as `fault` says, at the step it says.
class FaultyArena : public plane::SwapArena {
 public:
  FaultyArena(const std::string& name, std::unique_ptr<plane::SwapArena> inner,
              std::atomic<SwapFault>* fault)
      : SwapArena(name, inner->base(), inner->bytes()), inner_(std::move(inner)), fault_(fault) {}
  int device() const override { return -1; }
  absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewTwin(
      const std::string& name) const override {
    auto twin = inner_->NewTwin(name);
    if (!twin.ok()) return twin.status();
    return std::unique_ptr<plane::SwapArena>(
        std::make_unique<FaultyArena>(name, *std::move(twin), fault_));
  }

 protected:
  const char* kind() const override { return "host"; }
  absl::Status DoBeginSwap(plane::SwapArena& other) override {
    auto& twin = dynamic_cast<FaultyArena&>(other);
    SwapFault fault = SwapFault::kMidwayPutBack;
    if (!fault_->compare_exchange_strong(fault, SwapFault::kNone)) {
      fault = SwapFault::kMidwayLost;
      if (!fault_->compare_exchange_strong(fault, SwapFault::kNone)) {
        return inner_->BeginSwap(*twin.inner_);
      }
    }
    const absl::Status s = inner_->SwapWith(*twin.inner_);
    if (!s.ok()) return s;
    if (fault == SwapFault::kMidwayPutBack) {
      const absl::Status back = inner_->SwapWith(*twin.inner_);
      return absl::InternalError(absl::StrCat(
          "swapping ", Describe(), " with ", twin.Describe(), ": injected failure midway; ",
          back.ok() ? "both keep their memory" : back.ToString()));
    }
    mprotect(base(), static_cast<size_t>(bytes()), PROT_NONE);
    MarkUnusable();
    return absl::InternalError(absl::StrCat("swapping ", Describe(), " with ", twin.Describe(),
                                            ": injected failure midway; mapping it back failed "
                                            "too: it is unusable"));
  }
  absl::Status DoFinishSwap(plane::SwapArena& other) override {
    auto& twin = dynamic_cast<FaultyArena&>(other);
    SwapFault fault = SwapFault::kFinishFails;
    const bool fail = fault_->compare_exchange_strong(fault, SwapFault::kNone);
    RETURN_IF_ERROR(inner_->FinishSwap(*twin.inner_));
    if (!fail) return absl::OkStatus();
    mprotect(twin.base(), static_cast<size_t>(twin.bytes()), PROT_NONE);
    return absl::InternalError("injected failure remapping the twin's range");
  }
  absl::Status UndoSwap(plane::SwapArena& other) override {
    auto& twin = dynamic_cast<FaultyArena&>(other);
    mprotect(twin.base(), static_cast<size_t>(twin.bytes()), PROT_READ | PROT_WRITE);
    return inner_->SwapWith(*twin.inner_);
  }

 private:
  std::unique_ptr<plane::SwapArena> inner_;
  std::atomic<SwapFault>* fault_;
};

class FaultyBackend : public host::HostBackend {
 public:
  FaultyBackend() : HostBackend(plane::BackendConfig()) {}
  absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewSwapArena(int64_t bytes,
                                                                 const std::string& name) override {
    auto inner = HostBackend::NewSwapArena(bytes, name);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<plane::SwapArena>(
        std::make_unique<FaultyArena>(name, *std::move(inner), &fault));
  }
  std::atomic<SwapFault> fault{SwapFault::kNone};
};

class FaultyHostSwap : public ShadowSwapFactory {
 public:
  std::string Name() const override { return "FaultyHost"; }
  plane::Backend& backend() override { return backend_; }
  transport::MemorySpace space() const override { return transport::MemorySpace::kHost; }
  void Fail(SwapFault f) { backend_.fault = f; }

 private:
  FaultyBackend backend_;
};

class ShadowSwapFaultTest : public ShadowSwapTest {
 protected:
  void FailNextSwap(SwapFault fault) { static_cast<FaultyHostSwap&>(f()).Fail(fault); }
};

void ExpectNames(const absl::Status& s, std::initializer_list<const char*> parts) {
  for (const char* part : parts) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s;
  }
}

// A swap that fails midway and puts the memory back: the commit fails
// naming the worker and the arena, the live arena holds V-1 whole, and the
// next sync swaps (a new twin).
TEST_P(ShadowSwapFaultTest, AFailedSwapLeavesVMinus1WholeAndTheNextSyncSwaps) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 2);
  ASSERT_TRUE(set.Commit().ok());
  ExpectLive(2, 1, "after the first swap");
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 3);
  FailNextSwap(SwapFault::kMidwayPutBack);
  const absl::Status s = set.Commit();
  ASSERT_FALSE(s.ok());
  // Named by the worker first (the twin's name, "worker 3 twin", is no
  // proof), then the arena, the failure and what live holds.
  EXPECT_TRUE(absl::StartsWith(s.message(), "worker 3: swap commit of host arena 'weights'")) << s;
  ExpectNames(s, {"injected failure midway", "keep the version they held, whole"});
  ExpectLive(2, 1, "after the failed swap: V-1 whole");
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_STREQ(set.commit_kind(), "swap");
  WriteShadows(set, 4);
  ASSERT_TRUE(set.Commit().ok());
  ExpectLive(4, 1, "the next sync");
}

// A swap that fails midway and cannot put the memory back: the commit says
// the arena is unusable, and every later sync into it is refused with a
// clear error instead of touching the range (which would fault).
TEST_P(ShadowSwapFaultTest, AnArenaASwapCouldNotPutBackIsRefusedNotTouched) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 2);
  FailNextSwap(SwapFault::kMidwayLost);
  const absl::Status s = set.Commit();
  ASSERT_FALSE(s.ok());
  ExpectNames(s, {"worker 3", "'weights'", "unusable", "serve nothing"});
  EXPECT_FALSE(arena_->usable());
  for (const v1::StagingMode mode : {v1::STAGING_DEVICE_SHADOW, v1::STAGING_HOST_SHADOW}) {
    const absl::Status again = set.Prepare(Writes(), mode, live_, "worker 3");
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    ExpectNames(again, {"worker 3", "'weights'", "unusable", "free it"});
  }
}

// The second step fails (the twin's range cannot be remapped): the live
// arena already serves the new version, whole; the twin is dropped as
// unusable, and the next sync makes a new one and swaps.
TEST_P(ShadowSwapFaultTest, AFailedFinishSwapKeepsTheNewVersionAndTheNextSyncSwaps) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 2);
  ASSERT_TRUE(set.Commit().ok());
  FailNextSwap(SwapFault::kFinishFails);
  const absl::Status s = set.FinishSwap();
  ASSERT_FALSE(s.ok());
  ExpectNames(s, {"finishing a swap of host arena 'weights'", "worker 3 twin", "injected failure",
                  "the twin is unusable"});
  EXPECT_TRUE(arena_->usable());
  ExpectLive(2, 1, "after the failed FinishSwap: V whole");
  EXPECT_TRUE(set.FinishSwap().ok()) << "nothing left to finish";
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_STREQ(set.commit_kind(), "swap");
  WriteShadows(set, 3);
  ASSERT_TRUE(set.Commit().ok());
  ExpectLive(3, 1, "the next sync");
}

// The same failure found by the next Prepare (which finishes the swap
// first): logged, a new twin, the sync goes on.
TEST_P(ShadowSwapFaultTest, APrepareAfterAFailedFinishMakesANewTwin) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 2);
  ASSERT_TRUE(set.Commit().ok());
  FailNextSwap(SwapFault::kFinishFails);
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  ExpectLive(2, 1, "V whole");
  WriteShadows(set, 3);
  ASSERT_TRUE(set.Commit().ok());
  ExpectLive(3, 1, "the next sync");
}

// SwapWith whose second step fails undoes the first: both ranges are back
// on their own memory, and neither is marked unusable.
TEST_P(ShadowSwapFaultTest, AnUndoneSwapWithLeavesBothArenasUsable) {
  auto twin = arena_->NewTwin("twin");
  ASSERT_TRUE(twin.ok()) << twin.status();
  Set(0, arena_->bytes(), 5);
  std::memset((*twin)->base(), 6, static_cast<size_t>((*twin)->bytes()));
  FailNextSwap(SwapFault::kFinishFails);
  const absl::Status s = arena_->SwapWith(**twin);
  ASSERT_FALSE(s.ok());
  ExpectNames(s, {"'weights'", "'twin'", "injected failure", "both keep their memory"});
  EXPECT_TRUE(arena_->usable());
  EXPECT_TRUE((*twin)->usable()) << "restored, so usable";
  ExpectLive(5, 5, "undone");
  EXPECT_EQ(static_cast<const uint8_t*>((*twin)->base())[0], 6);
  ASSERT_TRUE(arena_->SwapWith(**twin).ok());
  ExpectLive(6, 6, "swapped");
}

// An arena a failed swap left unusable is refused clearly by an in-place
// sync whose part names a tensor in it, and by the arena set's check that
// registration runs, not only by staged syncs.
TEST_P(ShadowSwapFaultTest, AnUnusableArenaIsRefusedInPlaceAndAtRegistration) {
  TensorTable tensors({"inference"}, &f().backend());
  LocalTensor t;
  t.reg.set_name("a");
  t.reg.set_dtype(v1::UINT8);
  t.reg.add_shape(kA);
  t.data = At(0);
  t.bytes = kA;
  std::vector<LocalTensor> local;
  local.push_back(std::move(t));
  ASSERT_TRUE(tensors.RegisterLocal("inference", std::move(local), false).ok());
  RunnerOptions options;
  options.backend = &f().backend();
  options.arenas = arenas_.get();
  SyncRunner runner(&tensors, nullptr, options);
  v1::SyncAssignment a = testing::TestAssignment("s1", /*plan=*/true);
  a.mutable_plan()->add_names("inference/a");
  v1::ReportResultRequest before = runner.Run(a, nullptr, "lease", nullptr);
  ASSERT_EQ(before.code(), 0) << before.message();

  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  FailNextSwap(SwapFault::kMidwayLost);
  ASSERT_FALSE(set.Commit().ok());
  ASSERT_FALSE(arena_->usable());

  a.set_sync_id("s2");
  a.set_version(2);
  v1::ReportResultRequest after = runner.Run(a, nullptr, "lease", nullptr);
  EXPECT_EQ(after.code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition))
      << after.message();
  ExpectNames(absl::UnknownError(after.message()),
              {"worker 0", "tensor 'inference/a'", "'weights'", "unusable", "free it"});
  const absl::Status reg = arenas_->CheckUsable(At(kB), "embedded worker x", "tensor 'b'");
  EXPECT_EQ(reg.code(), absl::StatusCode::kFailedPrecondition) << reg;
  ExpectNames(reg, {"embedded worker x", "tensor 'b'", "'weights'", "unusable"});
  EXPECT_TRUE(arenas_->CheckUsable(&reg, "x", "y").ok()) << "outside every arena";
}

INSTANTIATE_TEST_SUITE_P(Host, ShadowSwapFaultTest,
                         ::testing::Values(std::make_shared<FaultyHostSwap>()),
                         ShadowSwapTest::ParamName);

}  // namespace
}  // namespace wsync::agent
