// The executor's pipelining (pack-ahead into the second staging set, local
// work during the transfer) over Gloo on loopback: many rounds with staging
// caps of exactly one round's buckets, relays that re-send what the previous
// round received (staged and zero-copy), local copies, local and mixed
// reduces; every destination byte checked, peak staging bounded by two
// rounds, abort mid-pipeline.
#include "tests/worker/exec/forwarding_transport.h"
#include "tests/worker/exec/pipelined_fixture.h"

namespace wsync::exec::testing {
namespace {

TEST_F(PipelinedExecutorTest, EveryByteRightWithRelaysCopiesReducesAndTinyStaging) {
  PlanGen g(7);
  const v1::Plan plan = MakePlan(g);
  SetUpCluster({});
  for (int sync = 0; sync < 2; ++sync) {  // the second replays the cached schedule
    ClearDestinations();
    std::vector<int64_t> sampled;
    auto out = RunSampled(plan, &sampled);
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE(out[w].ok()) << "worker " << w << ": " << out[w].status();
      auto bound = BindPlan(plan, w, cluster_.registry(w), MemorySpace::kHost);
      ASSERT_TRUE(bound.ok()) << bound.status();
      const BoundPlan& b = **bound;
      const SyncStats& st = *out[w];
      EXPECT_EQ(st.rounds.size(), static_cast<size_t>(kRounds));
      EXPECT_LE(st.peak_staging_bytes, TwoRoundPeak(b)) << "worker " << w;
      EXPECT_LE(st.peak_staging_bytes, 2 * b.max_staging_bytes);
      EXPECT_GT(st.peak_staging_bytes, b.max_staging_bytes) << "never packed ahead";
      EXPECT_LE(sampled[w], TwoRoundPeak(b)) << "worker " << w;
      EXPECT_LE(cluster_.executor(w).allocated_staging_bytes(), 2 * b.max_staging_bytes + 255);
      EXPECT_EQ(cluster_.executor(w).current_staging_bytes(), 0);
      // Relays (every 4th round from 2 on) are packed after the round before.
      EXPECT_GT(st.rounds_packed_ahead, 0);
      EXPECT_EQ(st.rounds_packed_ahead, kRounds - 1 - 4) << "relay rounds 2, 6, 10, 14 wait";
      EXPECT_EQ(st.rounds_local_early, kRounds);
      EXPECT_EQ(st.rounds_finished_async, kRounds - 7);
    }
    CheckDestinations(g);
  }
}

TEST_F(PipelinedExecutorTest, BucketChecksumsQueuedBesideTransfersMatchAndKeepThePipeline) {
  PlanGen g(7);
  const v1::Plan plan = MakePlan(g);
  SetUpCluster({});
  for (int w = 0; w < kWorkers; ++w) cluster_.executor(w).set_checksums(true);
  for (int sync = 0; sync < 2; ++sync) {
    ClearDestinations();
    auto out = cluster_.Run(plan, absl::Seconds(60));
    // bucket -> {sent hashes, received hashes}, with the worker of each.
    std::map<int64_t, std::pair<std::vector<std::pair<int, uint64_t>>,
                                std::vector<std::pair<int, uint64_t>>>>
        by_bucket;
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE(out[w].ok()) << "worker " << w << ": " << out[w].status();
      // The lazy data ops run every hash as late as the interpreter lets
      // them: a receive hash issued before its bytes arrived, or after the
      // staging was reused, would differ from the sender's.
      EXPECT_EQ(out[w]->rounds_finished_async, kRounds - 7) << "checksums serialized rounds";
      for (const BucketChecksum& c : out[w]->checksums) {
        auto& side = c.sent ? by_bucket[c.bucket].first : by_bucket[c.bucket].second;
        side.emplace_back(w, c.hash);
      }
    }
    int compared = 0;
    std::vector<int> received_by(kWorkers, 0);
    for (const v1::Bucket& b : plan.buckets()) {
      if (b.sender() != b.receiver()) ++received_by[b.receiver()];
    }
    for (int w = 0; w < kWorkers; ++w) {
      // Gloo names every receive of a round but the last as it lands: those
      // are hashed then, the rest with the unpack.
      EXPECT_GT(out[w]->recv_hashes_as_landed, 0) << "worker " << w;
      EXPECT_LT(out[w]->recv_hashes_as_landed, received_by[w]) << "worker " << w;
    }
    for (const v1::Bucket& b : plan.buckets()) {
      if (b.sender() == b.receiver()) continue;
      const auto& [sent, received] = by_bucket[b.id()];
      ASSERT_EQ(sent.size(), 1u) << "bucket " << b.id();
      ASSERT_EQ(received.size(), 1u) << "bucket " << b.id();
      EXPECT_EQ(sent[0].first, b.sender());
      EXPECT_EQ(received[0].first, b.receiver());
      EXPECT_EQ(sent[0].second, received[0].second) << "bucket " << b.id();
      ++compared;
    }
    EXPECT_GT(compared, 0);
    EXPECT_EQ(by_bucket.size(), static_cast<size_t>(compared)) << "only network buckets hashed";
    CheckDestinations(g);
  }
}

TEST_F(PipelinedExecutorTest, PipelineOffGivesTheSameBytesWithOneRoundOfStaging) {
  PlanGen g(11);
  const v1::Plan plan = MakePlan(g);
  ExecutorOptions o;
  o.pipeline = false;
  SetUpCluster(o);
  ClearDestinations();
  auto out = cluster_.Run(plan, absl::Seconds(60));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(out[w].ok()) << out[w].status();
    auto bound = BindPlan(plan, w, cluster_.registry(w), MemorySpace::kHost);
    ASSERT_TRUE(bound.ok());
    EXPECT_EQ(out[w]->peak_staging_bytes, (*bound)->max_staging_bytes);
    EXPECT_EQ(out[w]->rounds_packed_ahead, 0);
    EXPECT_EQ(out[w]->rounds_local_early, 0);
    EXPECT_EQ(out[w]->rounds_finished_async, 0);
  }
  CheckDestinations(g);
}

TEST_F(PipelinedExecutorTest, ScheduleHoldsBackRelayRoundsOnly) {
  PlanGen g(3);
  const v1::Plan plan = MakePlan(g);
  SetUpCluster({});
  for (int w = 0; w < kWorkers; ++w) {
    auto bound = BindPlan(plan, w, cluster_.registry(w), MemorySpace::kHost);
    ASSERT_TRUE(bound.ok()) << bound.status();
    auto built = BuildPipelineSchedule(**bound);
    ASSERT_TRUE(built.ok()) << built.status();
    const PipelineSchedule& s = *built;
    ASSERT_EQ(s.rounds.size(), static_cast<size_t>(kRounds));
    EXPECT_FALSE(s.rounds[0].pack_ahead);
    for (int r = 1; r < kRounds; ++r) {
      // Relay rounds read what the round before received.
      EXPECT_EQ(s.rounds[r].pack_ahead, r % 4 != 2) << "worker " << w << " round " << r;
      EXPECT_TRUE(s.rounds[r].local_early) << "worker " << w << " round " << r;
    }
    for (int r = 0; r < kRounds; ++r) {
      EXPECT_EQ(s.rounds[r].finish_async, FinishesAsync(r)) << "worker " << w << " round " << r;
    }
    EXPECT_EQ(s.rounds[0].local_reduces.size(), 1u);   // {w, w}
    EXPECT_EQ(s.rounds[0].staged_reduces.size(), 1u);  // {w, u}
    for (int r = 0; r < kRounds; ++r) {
      EXPECT_EQ(s.rounds[r].staging_offset % 256, 0);
      EXPECT_LE(s.rounds[r].staging_offset + (*bound)->rounds[r].staging_bytes, s.staging_bytes);
      if (r > 0) {  // neighbours side by side: even from the start, odd up to the end
        const int even = r % 2 == 0 ? r : r - 1, odd = r % 2 == 0 ? r - 1 : r;
        EXPECT_LE(s.rounds[even].staging_offset + (*bound)->rounds[even].staging_bytes,
                  s.rounds[odd].staging_offset);
      }
    }
    EXPECT_LE(s.staging_bytes, 2 * (*bound)->max_staging_bytes + 255);
  }
}

TEST_F(PipelinedExecutorTest, AbortMidPipelineEndsEveryWorkerPromptly) {
  PlanGen g(5);
  const v1::Plan plan = MakePlan(g);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(30);
  SetUpCluster(o);
  std::atomic<bool> aborted{false};
  const absl::Time start = absl::Now();
  auto out = cluster_.Run(plan, absl::Seconds(60), {}, [&](const Progress& p) {
    if (p.worker == 0 && p.rounds_done == 5 && !aborted.exchange(true)) {
      for (int w = 0; w < kWorkers; ++w) cluster_.executor(w).Abort("test abort");
    }
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(aborted.load());
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_FALSE(out[w].ok()) << "worker " << w;
    EXPECT_EQ(out[w].status().code(), absl::StatusCode::kCancelled) << out[w].status();
    EXPECT_EQ(cluster_.executor(w).current_staging_bytes(), 0);
  }
  EXPECT_NE(out[0].status().message().find("test abort"), std::string::npos);
}
// Names only every other receive it is told of (and those late, at its
// return), so the executor mixes hashes queued as parts land with hashes
// queued with deferred unpacks, round after round.
class SomeLandedTransport : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const transport::RoundHooks& hooks) override {
    std::vector<size_t> named;
    transport::RoundHooks forwarded = hooks;
    forwarded.on_landed = [&](absl::Span<const size_t> indices, const transport::LandingMark&) {
      for (size_t i : indices) {
        if (i % 2 == 0) named.push_back(i);
      }
    };
    absl::Status s = inner().RunRound(sends, recvs, deadline, forwarded);
    if (s.ok() && hooks.on_landed && !named.empty()) hooks.on_landed(named, {});
    return s;
  }
};

TEST_F(PipelinedExecutorTest, ChecksumsMixLandedAndDeferredHashesAndStillMatch) {
  PlanGen g(29);
  const v1::Plan plan = MakePlan(g);
  for (int w = 0; w < kWorkers; ++w) {
    cluster_.WrapTransport(w, [](std::unique_ptr<transport::Transport> t) {
      return std::make_unique<SomeLandedTransport>(std::move(t));
    });
  }
  SetUpCluster({});
  for (int w = 0; w < kWorkers; ++w) cluster_.executor(w).set_checksums(true);
  for (int sync = 0; sync < 2; ++sync) {
    ClearDestinations();
    auto out = cluster_.Run(plan, absl::Seconds(60));
    std::map<int64_t, std::vector<uint64_t>> sent, received;
    int landed = 0;
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE(out[w].ok()) << "worker " << w << ": " << out[w].status();
      EXPECT_EQ(out[w]->rounds_finished_async, kRounds - 7) << "hashes serialized rounds";
      landed += out[w]->recv_hashes_as_landed;
      for (const BucketChecksum& c : out[w]->checksums) {
        (c.sent ? sent : received)[c.bucket].push_back(c.hash);
      }
    }
    EXPECT_GT(landed, 0);
    int compared = 0;
    for (const v1::Bucket& b : plan.buckets()) {
      if (b.sender() == b.receiver()) continue;
      ASSERT_EQ(sent[b.id()].size(), 1u) << "bucket " << b.id();
      ASSERT_EQ(received[b.id()].size(), 1u) << "bucket " << b.id() << " hashed twice or never";
      EXPECT_EQ(sent[b.id()][0], received[b.id()][0]) << "bucket " << b.id();
      ++compared;
    }
    EXPECT_GT(compared, 0);
    CheckDestinations(g);
  }
}

}  // namespace
}  // namespace wsync::exec::testing
