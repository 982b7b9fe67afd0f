// Checksums of direct writes (executor.h): the parts of each (writer,
// receiver) pair, the puts issued part by part, each part's count posted as
// its mark is reached, and the buckets hashed from their views (the
// writer's sources, the receiver's destinations once their part landed).
#include <algorithm>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/exec/direct_parts.h"
#include "worker/exec/executor.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {

using internal::kDone;
using internal::kParts;
using internal::kSlotsPerPeer;
using internal::Wrap;

namespace {

// A part count as posted: the pair's sync sequence, then the count.
constexpr int kPartBits = 16;
constexpr uint64_t kPartMask = (uint64_t{1} << kPartBits) - 1;
static_assert(kMaxDirectParts <= kPartMask, "a part count must fit its bits");
uint64_t PartsValue(uint64_t seq, int32_t parts) {
  return (seq << kPartBits) | static_cast<uint64_t>(parts);
}

}  // namespace

void Executor::PrepareDirectParts(const BoundPlan& plan) {
  const size_t n = plan.direct_buckets.size();
  direct_part_.assign(n, 0);
  direct_hash_handles_.clear();
  parts_to_.clear();
  parts_from_.clear();
  step_puts_.clear();
  step_put_index_.clear();
  step_handles_.clear();
  // Each pair's buckets, in (round, seq) order on both sides.
  std::map<std::pair<bool, int32_t>, std::vector<size_t>> pairs;
  for (size_t d = 0; d < n; ++d) {
    pairs[{plan.direct_buckets[d].sent, plan.direct_buckets[d].peer}].push_back(d);
  }
  for (auto& [key, list] : pairs) {
    std::stable_sort(list.begin(), list.end(), [&](size_t x, size_t y) {
      const DirectBucket& a = plan.direct_buckets[x];
      const DirectBucket& b = plan.direct_buckets[y];
      return std::make_pair(a.round, a.seq) < std::make_pair(b.round, b.seq);
    });
    std::vector<int64_t> bytes;
    for (size_t d : list) bytes.push_back(plan.direct_buckets[d].bytes);
    const std::vector<int32_t> part =
        CutDirectParts(bytes, DirectPartCut{options_.landing_parts, options_.min_landing_part_bytes,
                                            options_.direct_part_tail_ratio});
    for (size_t i = 0; i < list.size(); ++i) direct_part_[list[i]] = part[i];
    (key.first ? parts_to_ : parts_from_)[key.second] = part.empty() ? 0 : part.back() + 1;
  }
  // Each part's puts by put phase (as plan.puts), then in round order.
  std::vector<size_t> sent;
  for (size_t d = 0; d < n; ++d) {
    const DirectBucket& b = plan.direct_buckets[d];
    direct_hash_handles_.push_back(ops_->PrepareWireHash(b.items));
    if (b.sent) sent.push_back(d);
  }
  std::stable_sort(sent.begin(), sent.end(), [&](size_t x, size_t y) {
    return plan.direct_buckets[x].put_phase < plan.direct_buckets[y].put_phase;
  });
  for (size_t d : sent) {
    const DirectBucket& b = plan.direct_buckets[d];
    const size_t k = static_cast<size_t>(direct_part_[d]);
    if (step_puts_.size() <= k) {
      step_puts_.resize(k + 1);
      step_put_index_.resize(k + 1);
    }
    for (int32_t i = 0; i < b.num_puts; ++i) {
      step_puts_[k].push_back(plan.puts[b.first_put + i]);
      step_put_index_[k].push_back(b.first_put + i);
    }
  }
  for (const std::vector<CopyItem>& step : step_puts_) {
    step_handles_.push_back(writer_ == nullptr || step.empty() ? ItemsHandle{}
                                                               : writer_->Prepare(step));
  }
}

bool Executor::SplitPuts(const BoundPlan& plan) const {
  (void)plan;
  return checksums_ && mailbox_sync_ && !step_puts_.empty();
}

absl::Status Executor::QueueDirectHash(const BoundPlan& plan, size_t d) {
  const DirectBucket& b = plan.direct_buckets[d];
  const int64_t slot = static_cast<int64_t>(queued_hashes_.size());
  queued_hashes_.push_back(BucketChecksum{b.bucket, 0, b.sent});
  const absl::Status s = ops_->QueueWireChecksum(b.items, b.bytes, slot, direct_hash_handles_[d]);
  if (s.ok()) return s;
  return absl::Status(
      s.code(),
      absl::StrCat("worker ", plan.worker, " round ", b.round, ": checksum of bucket ", b.bucket,
                   b.sent ? " written directly to worker " : " written directly by worker ", b.peer,
                   ": ", s.message()));
}

absl::Status Executor::HashWriterParts(const BoundPlan& plan, int32_t writer, int32_t from,
                                       int32_t to, SyncStats& stats) {
  const bool early = to < parts_from_[writer];  // later parts still to come
  for (size_t d = 0; d < plan.direct_buckets.size(); ++d) {
    const DirectBucket& b = plan.direct_buckets[d];
    if (b.sent || b.peer != writer || direct_part_[d] < from || direct_part_[d] >= to) continue;
    RETURN_IF_ERROR(QueueDirectHash(plan, d));
    if (early) {
      ++stats.direct_hashes_as_landed;
    } else {
      stats.direct_tail_hash_bytes += b.bytes;
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::HashDirectReceived(const BoundPlan& plan) {
  for (size_t d = 0; d < plan.direct_buckets.size(); ++d) {
    if (!plan.direct_buckets[d].sent) RETURN_IF_ERROR(QueueDirectHash(plan, d));
  }
  return absl::OkStatus();
}

absl::Status Executor::PumpDirectParts(const BoundPlan& plan, absl::Time deadline,
                                       SyncStats& stats) {
  const std::string where =
      absl::StrCat("worker ", plan.worker, ": direct-write parts (to workers ",
                   absl::StrJoin(plan.direct_write_to, ","), ", from workers ",
                   absl::StrJoin(plan.direct_written_by, ","), ")");
  const int64_t me = plan.worker;
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  size_t next_step = 0;
  std::map<int32_t, int32_t> hashed;  // writer -> parts hashed
  for (int32_t w : plan.direct_written_by) hashed[w] = 0;
  for (int64_t idle = 0;; ++idle) {
    bool progress = false;
    // This worker's parts, in order, as their marks are reached.
    while (next_step < step_marks_.size()) {
      auto reached = writer_->PollMark(step_marks_[next_step]);
      if (!reached.ok()) {
        return Wrap(reached.status(), absl::StrCat(where, ": part ", next_step, " of its puts"));
      }
      if (!*reached) break;
      for (const auto& [r, parts] : parts_to_) {
        if (static_cast<int32_t>(next_step) >= parts) continue;
        RETURN_IF_ERROR(
            Wrap(writer_->Post(r, kSlotsPerPeer * me + kParts,
                               PartsValue(mailbox_seq_[r], static_cast<int32_t>(next_step) + 1)),
                 where));
        ++stats.direct_parts_posted;
      }
      ++next_step;
      progress = true;
    }
    bool through = next_step == step_marks_.size();
    // The parts written into this worker that landed since the last look.
    for (auto& [w, got] : hashed) {
      const int32_t parts = parts_from_[w];
      if (got >= parts) continue;
      through = false;
      auto read = writer_->ReadMailbox(kSlotsPerPeer * w + kParts);
      if (!read.ok()) return Wrap(read.status(), where);
      ++stats.mailbox_polls;
      const uint64_t v = *read;
      if ((v & kMailboxFailed) != 0) {
        return absl::AbortedError(absl::StrCat(where, ": peer ", w,
                                               " failed its part of sync sequence ",
                                               (v & ~kMailboxFailed), " (see its error)"));
      }
      const uint64_t want = mailbox_seq_[w];
      const uint64_t seq = v >> kPartBits;
      const int64_t count = static_cast<int64_t>(v & kPartMask);
      if (seq < want || (seq == want && count <= got)) {
        // Nothing new. A writer that posts no parts (checksums off there)
        // still posts its done token once every put landed.
        auto done = writer_->ReadMailbox(kSlotsPerPeer * w + kDone);
        if (!done.ok()) return Wrap(done.status(), where);
        if (*done != want) continue;
        RETURN_IF_ERROR(HashWriterParts(plan, w, got, parts, stats));
        got = parts;
        progress = true;
        continue;
      }
      if (seq > want || count > parts) {
        return absl::InternalError(
            absl::StrCat(where, ": peer ", w, " posted part ", count, " of sequence ", seq,
                         " where this worker expects up to ", parts, " of sequence ", want,
                         ": the two sides' syncs or part cuts diverged (same landing_parts, "
                         "min_landing_part_bytes and direct_part_tail_ratio on every worker?)"));
      }
      RETURN_IF_ERROR(HashWriterParts(plan, w, got, static_cast<int32_t>(count), stats));
      got = static_cast<int32_t>(count);
      progress = true;
    }
    if (through) return absl::OkStatus();
    if (progress) {
      idle = 0;
      continue;
    }
    if (aborted_.load()) {
      absl::MutexLock lock(&mu_);
      return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
    }
    if (absl::Now() >= round_deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(where,
                       ": parts still missing at the deadline (round_timeout or the "
                       "sync's): ",
                       next_step, " of ", step_marks_.size(), " of its own put parts landed"));
    }
    if (idle >= 2000) {
      absl::SleepFor(absl::Microseconds(50));
    } else if (idle >= 200) {
      std::this_thread::yield();
    }
  }
}

}  // namespace wsync::exec
