// The composition root: the backend registry and DataPlane's channels over
// the host backend.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/node/backend_registry.h"
#include "worker/node/data_plane.h"
#include "worker/plane/kv_store.h"

namespace wsync::node {
namespace {

// One store that every rank's rendezvous reaches (as the controller's).
class SharedStore : public transport::KvStore {
 public:
  explicit SharedStore(transport::KvStore* store) : store_(store) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return store_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) override {
    return store_->Get(key, deadline);
  }

 private:
  transport::KvStore* const store_;
};

TEST(BackendRegistryTest, HostIsRegisteredAndPickedWithoutADevice) {
  const std::vector<std::string> names = BackendNames();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "host");
  plane::BackendConfig config;
  EXPECT_EQ(BackendNameFor(config), "host");
  config.device = 0;
  EXPECT_EQ(BackendNameFor(config), "cuda");
  auto host = CreateBackend("host", plane::BackendConfig());
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ((*host)->Name(), "host");
  EXPECT_EQ((*host)->transport_kind(), v1::TRANSPORT_GLOO);
  EXPECT_TRUE((*host)->capabilities().empty());
}

TEST(BackendRegistryTest, AnUnknownBackendNamesTheOnesThisBuildHas) {
  auto b = CreateBackend("tpu", plane::BackendConfig());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("'tpu'"), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("host"), std::string::npos) << b.status();
}

#ifndef WSYNC_WITH_CUDA
TEST(BackendRegistryTest, AHostOnlyBuildNamesTheBuildOptionForCuda) {
  plane::BackendConfig config;
  config.device = 1;
  auto b = CreateBackend("cuda", config);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("--device 1"), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("WSYNC_WITH_CUDA=ON"), std::string::npos) << b.status();
}
#endif

class DataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CreateBackend("host", plane::BackendConfig());
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }
  std::unique_ptr<plane::Backend> backend_;
};

TEST_F(DataPlaneTest, LocalChannelsAreKeptPerTransferWhileTheRankStays) {
  DataPlane plane(backend_.get(), exec::ExecutorOptions());
  ChannelSpec spec;
  spec.connect.rank = 3;
  auto no_store = []() -> std::unique_ptr<transport::KvStore> {
    ADD_FAILURE() << "a local channel needs no rendezvous";
    return nullptr;
  };
  auto a = plane.Ensure("t", spec, no_store);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->transport->rank(), 3);
  EXPECT_EQ((*a)->transport->Name(), "local-only");
  ASSERT_NE((*a)->executor, nullptr);
  ASSERT_NE((*a)->writer, nullptr);
  auto again = plane.Ensure("t", spec, no_store);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
  auto other = plane.Ensure("u", spec, no_store);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *a);
  spec.connect.rank = 4;
  auto moved = plane.Ensure("t", spec, no_store);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ((*moved)->transport->rank(), 4);
}

TEST_F(DataPlaneTest, ATransportOfAnotherKindIsRefusedNamingBoth) {
  DataPlane plane(backend_.get(), exec::ExecutorOptions());
  ChannelSpec spec;
  spec.network = true;
  spec.generation = 1;
  spec.kind = v1::TRANSPORT_NCCL;
  spec.connect.size = 2;
  auto ch = plane.Ensure("t", spec, [] { return std::make_unique<transport::InMemoryKvStore>(); });
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ch.status().message().find("'nccl'"), std::string::npos) << ch.status();
  EXPECT_NE(ch.status().message().find("gloo on host memory"), std::string::npos) << ch.status();
}

// Two ranks of one transfer generation rendezvous through one store; the
// channel is kept for the generation and rebuilt for the next.
TEST_F(DataPlaneTest, NetworkChannelsAreKeptPerGeneration) {
  transport::InMemoryKvStore store;
  DataPlane planes[2] = {DataPlane(backend_.get(), exec::ExecutorOptions()),
                         DataPlane(backend_.get(), exec::ExecutorOptions())};
  auto ensure = [&](int64_t generation) {
    Channel* got[2] = {nullptr, nullptr};
    std::thread threads[2];
    for (int r = 0; r < 2; ++r) {
      threads[r] = std::thread([&, r] {
        ChannelSpec spec;
        spec.network = true;
        spec.generation = generation;
        spec.kind = v1::TRANSPORT_GLOO;
        spec.connect.prefix = absl::StrCat("node-test/", generation);
        spec.connect.rank = r;
        spec.connect.size = 2;
        spec.connect.deadline = absl::Now() + absl::Seconds(30);
        auto ch = planes[r].Ensure("t", spec, [&]() -> std::unique_ptr<transport::KvStore> {
          return std::make_unique<SharedStore>(&store);
        });
        EXPECT_TRUE(ch.ok()) << ch.status();
        if (ch.ok()) got[r] = *ch;
      });
    }
    for (auto& t : threads) t.join();
    return std::make_pair(got[0], got[1]);
  };
  const auto first = ensure(1);
  ASSERT_NE(first.first, nullptr);
  EXPECT_EQ(first.first->generation, 1);
  EXPECT_EQ(first.first->transport->rank(), 0);
  EXPECT_EQ(first.second->transport->rank(), 1);
  const auto same = ensure(1);
  EXPECT_EQ(same.first, first.first);
  const auto next = ensure(2);
  ASSERT_NE(next.first, nullptr);
  EXPECT_EQ(next.first->generation, 2);
}

}  // namespace
}  // namespace wsync::node
