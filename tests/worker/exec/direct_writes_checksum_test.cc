// Bucket checksums of direct writes (executor.h, "Direct writes with
// checksums"): both sides hash each directly written bucket from its views
// in wire order, the writer posts its puts' parts as they land and the
// receiver hashes each part then; a corrupted write, a mixed plan (some
// pairs direct, some through Gloo), the same bucket over both routes, token
// rounds and queued (lazy) data ops.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/plan_names.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/direct_writes_fixture.h"
#include "tests/worker/exec/plan_builder.h"
#include "worker/backends/host/host_peer_writer.h"

namespace wsync::exec::direct_writes_testing {
namespace {

constexpr int64_t kRows = 96, kCols = 64;

// Parts of a few KiB, so that the small test buckets go in several parts.
ExecutorOptions SmallParts() {
  ExecutorOptions o;
  o.landing_parts = 4;
  o.min_landing_part_bytes = 1;
  return o;
}

// Compares every network bucket's checksums as the controller does
// (controller/server/sync_staged.cc): exactly one from its sender and one
// from its receiver, equal; else an error naming the bucket, its tensor and
// both workers. `compared` counts the buckets compared.
absl::Status CompareAll(const v1::Plan& plan, const std::vector<absl::StatusOr<SyncStats>>& out,
                        int* compared = nullptr) {
  std::map<int64_t,
           std::pair<std::vector<std::pair<int, uint64_t>>, std::vector<std::pair<int, uint64_t>>>>
      by_bucket;
  for (size_t w = 0; w < out.size(); ++w) {
    if (!out[w].ok()) return out[w].status();
    for (const BucketChecksum& c : out[w]->checksums) {
      (c.sent ? by_bucket[c.bucket].first : by_bucket[c.bucket].second)
          .emplace_back(static_cast<int>(w), c.hash);
    }
  }
  int n = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() == b.receiver()) continue;
    const std::string where = absl::StrCat(
        "bucket ", b.id(), " (tensor ", PlanNameOrIndex(plan, b.pieces(0).tensor_name()),
        ") from worker ", b.sender(), " to worker ", b.receiver());
    const auto& [sent, received] = by_bucket[b.id()];
    if (sent.size() != 1 || received.size() != 1 || sent[0].first != b.sender() ||
        received[0].first != b.receiver()) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": ", sent.size(), " sent and ",
                                                        received.size(),
                                                        " received checksums, expected one each"));
    }
    if (sent[0].second != received[0].second) {
      return absl::DataLossError(absl::StrCat("checksum mismatch: ", where));
    }
    ++n;
  }
  if (static_cast<size_t>(n) != by_bucket.size()) {
    return absl::FailedPreconditionError("a checksum of no network bucket");
  }
  if (compared != nullptr) *compared = n;
  return absl::OkStatus();
}

// Network buckets `w` sends or receives.
int NetworkBucketsOf(const v1::Plan& plan, int w) {
  int n = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() != b.receiver() && (b.sender() == w || b.receiver() == w)) ++n;
  }
  return n;
}

TEST(DirectWritesChecksumTest, EveryDirectBucketHashesAlikeOnBothSidesInParts) {
  Cluster c(2);
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {nullptr, nullptr}, SmallParts()).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  for (int run = 0; run < 2; ++run) {  // the second replays the prepared lists
    auto out = c.Run(plan, absl::Seconds(30));
    int compared = 0;
    ASSERT_TRUE(CompareAll(plan, out, &compared).ok()) << CompareAll(plan, out);
    EXPECT_EQ(compared, 8) << "3 strided and 1 zero-copy bucket each way";
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ(out[w]->checksums.size(), static_cast<size_t>(NetworkBucketsOf(plan, w)));
      EXPECT_EQ(out[w]->bytes_put, out[w]->bytes_sent) << "checksums kept the direct writes";
      EXPECT_GE(out[w]->direct_parts_posted, 2) << "worker " << w << ": puts in parts";
      EXPECT_LE(out[w]->direct_parts_posted, 4);
    }
    CheckSwap(c, kRows, kCols);
  }
}

// Flips one byte of the receiver's destination after the put wrote it
// (before the receiver hashes it): a test hook, not the writer's behaviour.
class CorruptingWriter : public HostPeerWriter {
 public:
  explicit CorruptingWriter(uint8_t* target) : target_(target) {}
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    RETURN_IF_ERROR(HostPeerWriter::Put(items, handle, alone));
    for (const CopyItem& it : items) {
      const auto* begin = static_cast<const uint8_t*>(it.dst.data);
      if (!flipped_ && target_ >= begin && target_ < begin + 2) {
        *target_ ^= 0x40;
        flipped_ = true;
      }
    }
    return absl::OkStatus();
  }

 private:
  uint8_t* const target_;
  bool flipped_ = false;
};

TEST(DirectWritesChecksumTest, ACorruptedDirectWriteIsNamedByBucketTensorAndWorkers) {
  Cluster c(2);
  SetUpSwap(c, kRows, kCols);
  // Worker 0 writes rows [0, 32) of worker 1's "m" in round 0: its first
  // element, corrupted once written.
  CorruptingWriter writer(c.Data<uint8_t>(1, kDst, "m"));
  c.UseWriter(0, &writer);
  c.WriteDirectly(0, 1);
  c.WriteDirectly(1, 0);
  ASSERT_TRUE(c.Connect(SmallParts()).ok());
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  auto out = c.Run(plan, absl::Seconds(30));
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(out[w].ok()) << out[w].status();
  const absl::Status s = CompareAll(plan, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  int64_t bucket = -1;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() == 0 && b.receiver() == 1 && b.round() == 0 && !b.zero_copy()) bucket = b.id();
  }
  EXPECT_EQ(s.message(), absl::StrCat("checksum mismatch: bucket ", bucket,
                                      " (tensor m) from worker 0 to worker 1"));
  // Only that bucket differs.
  std::map<std::pair<int64_t, bool>, uint64_t> h;
  for (int w = 0; w < 2; ++w) {
    for (const BucketChecksum& x : out[w]->checksums) h[{x.bucket, x.sent}] = x.hash;
  }
  int differ = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() != b.receiver() && h[{b.id(), true}] != h[{b.id(), false}]) ++differ;
  }
  EXPECT_EQ(differ, 1);
}

TEST(DirectWritesChecksumTest, AMixedPlanHashesDirectAndTransportBucketsAlike) {
  Cluster c(2);
  SetUpSwap(c, kRows, kCols);
  c.WriteDirectly(0, 1);  // 1 -> 0 goes through Gloo
  ASSERT_TRUE(c.Connect(SmallParts()).ok());
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  for (int run = 0; run < 2; ++run) {
    auto out = c.Run(plan, absl::Seconds(30));
    int compared = 0;
    ASSERT_TRUE(CompareAll(plan, out, &compared).ok()) << CompareAll(plan, out);
    EXPECT_EQ(compared, 8);
    EXPECT_GT(out[0]->bytes_put, 0);
    EXPECT_EQ(out[1]->bytes_put, 0);
    EXPECT_GE(out[0]->direct_parts_posted, 2);
    EXPECT_EQ(out[1]->direct_parts_posted, 0);
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ(out[w]->checksums.size(), static_cast<size_t>(NetworkBucketsOf(plan, w)));
    }
    CheckSwap(c, kRows, kCols);
  }
}

// One wire definition for both routes: a bucket whose pieces tile it hashes
// the same written directly (from views) as packed and sent through Gloo.
TEST(DirectWritesChecksumTest, TheSameBucketHashesAlikeOverEitherRoute) {
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  std::map<std::pair<int64_t, bool>, uint64_t> hashes[2];
  for (int direct = 0; direct < 2; ++direct) {
    Cluster c(2);
    SetUpSwap(c, kRows, kCols);
    if (direct) {
      c.WriteDirectly(0, 1);
      c.WriteDirectly(1, 0);
    }
    ASSERT_TRUE(c.Connect(SmallParts()).ok());
    for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
    auto out = c.Run(plan, absl::Seconds(30));
    ASSERT_TRUE(CompareAll(plan, out).ok()) << CompareAll(plan, out);
    EXPECT_EQ(out[0]->bytes_put > 0, direct == 1);
    for (int w = 0; w < 2; ++w) {
      for (const BucketChecksum& x : out[w]->checksums) hashes[direct][{x.bucket, x.sent}] = x.hash;
    }
  }
  EXPECT_EQ(hashes[0].size(), 16u);
  EXPECT_EQ(hashes[0], hashes[1]);
}

// Holds each put mark unreached for a while after it is first polled, as a
// device's copy engines would: the receiver sees the parts one by one.
class SlowMarkWriter : public HostPeerWriter {
 public:
  absl::StatusOr<bool> PollMark(uint64_t mark) override {
    auto [it, fresh] = first_poll_.emplace(mark, absl::Now());
    (void)fresh;
    if (absl::Now() - it->second < absl::Milliseconds(30)) return false;
    return HostPeerWriter::PollMark(mark);
  }

 private:
  std::map<uint64_t, absl::Time> first_poll_;
};

TEST(DirectWritesChecksumTest, TheReceiverHashesEachPartAsItLands) {
  Cluster c(2);
  SetUpSwap(c, kRows, kCols);
  SlowMarkWriter writer;
  c.UseWriter(0, &writer);
  c.WriteDirectly(0, 1);
  ASSERT_TRUE(c.Connect(SmallParts()).ok());
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  auto out = c.Run(plan, absl::Seconds(30));
  ASSERT_TRUE(CompareAll(plan, out).ok()) << CompareAll(plan, out);
  const int parts = out[0]->direct_parts_posted;
  EXPECT_GE(parts, 2);
  // Every part but the last was hashed before the writer's next part landed
  // (4 buckets into worker 1, the last part's after the transfer).
  EXPECT_GE(out[1]->direct_hashes_as_landed, parts - 1);
  EXPECT_LT(out[1]->direct_hashes_as_landed, 4);
  EXPECT_EQ(out[0]->direct_hashes_as_landed, 0) << "worker 0 receives through Gloo";
  CheckSwap(c, kRows, kCols);
}

// Worker 0 writes worker 1 24 buckets of 2560 bytes (and a 1 KiB zero-copy
// one) in 4 parts of at least 2560 bytes: equal parts leave the receiver a
// quarter of the bytes to hash after the transfer; parts shrinking 4 times
// toward the end leave it one bucket.
TEST(DirectWritesChecksumTest, AShrinkingTailLeavesTheReceiverOneBucketToHashAfterTheTransfer) {
  constexpr int64_t kTallRows = 960;
  constexpr int kRounds = 24;
  constexpr int64_t kBucket = (kTallRows / kRounds) * (kCols / 2) * 2;
  std::map<int, int64_t> tail;
  for (int ratio : {0, 4}) {
    Cluster c(2);
    SetUpSwap(c, kTallRows, kCols);
    SlowMarkWriter writer;
    c.UseWriter(0, &writer);
    c.WriteDirectly(0, 1);
    ExecutorOptions o;
    o.landing_parts = 4;
    o.min_landing_part_bytes = kBucket;
    o.direct_part_tail_ratio = ratio;
    ASSERT_TRUE(c.Connect(o).ok());
    for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
    const v1::Plan plan = SwapPlan(kTallRows, kCols, kRounds);
    auto out = c.Run(plan, absl::Seconds(30));
    ASSERT_TRUE(CompareAll(plan, out).ok()) << CompareAll(plan, out);
    EXPECT_EQ(out[0]->direct_parts_posted, 4) << "ratio " << ratio;
    tail[ratio] = out[1]->direct_tail_hash_bytes;
    CheckSwap(c, kTallRows, kCols);
  }
  EXPECT_GE(tail[0], 5 * kBucket);
  EXPECT_EQ(tail[4], kBucket);
}

TEST(DirectWritesChecksumTest, TokenRoundsHashAfterTheDoneTokens) {
  Cluster c(2);
  ExecutorOptions o = SmallParts();
  o.mailbox_tokens = false;
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {nullptr, nullptr}, o).ok());
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  auto out = c.Run(plan, absl::Seconds(30));
  int compared = 0;
  ASSERT_TRUE(CompareAll(plan, out, &compared).ok()) << CompareAll(plan, out);
  EXPECT_EQ(compared, 8);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(out[w]->direct_parts_posted, 0);
    EXPECT_EQ(out[w]->mailbox_polls, 0);
  }
  CheckSwap(c, kRows, kCols);
}

// Data ops that run every call as late as they may (lazy_data_ops.h) and
// puts that land only when fenced or marked: a hash queued before its part
// landed would differ from the writer's.
TEST(DirectWritesChecksumTest, QueuedHashesRunAfterTheirPartsLanded) {
  Cluster c(2);
  testing::LazyDataOps ops[2];
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops[0], &ops[1]}, SmallParts()).ok());
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  auto out = c.Run(plan, absl::Seconds(30));
  ASSERT_TRUE(CompareAll(plan, out).ok()) << CompareAll(plan, out);
  for (int w = 0; w < 2; ++w) EXPECT_EQ(ops[w].checksums_queued(), 8) << "worker " << w;
  CheckSwap(c, kRows, kCols);
}

// A put that fails in a later part names its tensor by the whole put list
// (the part's item index mapped back), as an unsplit put does.
class FailingSecondPartWriter : public HostPeerWriter {
 public:
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    if (++calls_ == 2) return ItemError(absl::InternalError("copy engine fault"), "put", 0);
    return HostPeerWriter::Put(items, handle, alone);
  }

 private:
  int calls_ = 0;
};

TEST(DirectWritesChecksumTest, AFailedPutInALaterPartNamesItsTensor) {
  Cluster c(2);
  PlanBuilder pb;
  for (int k = 0; k < 4; ++k) {
    const std::string name = absl::StrCat("t", k);
    c.Add(0, kSrc, name, v1::FP32, 64);
    c.Add(1, kDst, name, v1::FP32, 64);
    pb.AddBucket(0, 1, 0,
                 {Piece(View(name, 0, {64}, v1::FP32), View(name, 0, {64}, v1::FP32), v1::FP32)});
  }
  FailingSecondPartWriter writer;
  c.UseWriter(0, &writer);
  c.WriteDirectly(0, 1);
  ASSERT_TRUE(c.Connect(SmallParts()).ok());
  for (int w = 0; w < 2; ++w) c.executor(w).set_checksums(true);
  auto out = c.Run(pb.Build(), absl::Seconds(10));
  ASSERT_FALSE(out[0].ok());
  const std::string msg(out[0].status().message());
  EXPECT_EQ(out[0].status().code(), absl::StatusCode::kInternal) << msg;
  EXPECT_NE(msg.find("(tensor 't1')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("part 1 of its puts"), std::string::npos) << msg;
  EXPECT_FALSE(out[1].ok()) << "the receiver must not report success";
}

}  // namespace
}  // namespace wsync::exec::direct_writes_testing
