// Swap commits through ShadowSet over the host backend's memfd arenas
// (tests/worker/agent/shadow_swap_suite.h), and swaps that fail midway
// (a test-side arena that injects the failure).
#include <sys/mman.h>

#include <atomic>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/worker/agent/shadow_swap_suite.h"
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
  // The memory was exchanged, then a later step failed and the swap put
  // each range back on its own memory (the seam's contract on error).
  kMidwayPutBack,
  // The memory was exchanged, then a later step failed and putting it back
  // failed too: the live range is left inaccessible (PROT_NONE stands for
  // the unmapped range a failed MAP_FIXED / cuMemMap leaves).
  kMidwayLost,
};

// A host arena whose swap fails as `fault` says.
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
  absl::Status SwapWith(plane::SwapArena& other) override {
    auto& twin = dynamic_cast<FaultyArena&>(other);
    const SwapFault fault = fault_->exchange(SwapFault::kNone);
    const absl::Status s = inner_->SwapWith(*twin.inner_);
    if (fault == SwapFault::kNone || !s.ok()) return s;
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

 protected:
  const char* kind() const override { return "host"; }

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

INSTANTIATE_TEST_SUITE_P(Host, ShadowSwapFaultTest,
                         ::testing::Values(std::make_shared<FaultyHostSwap>()),
                         ShadowSwapTest::ParamName);

}  // namespace
}  // namespace wsync::agent
