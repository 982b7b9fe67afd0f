#include "worker/exec/bound_plan.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bucket_steps.h"
#include "common/checked_math.h"
#include "common/plan_pieces.h"
#include "common/status_macros.h"
#include "worker/exec/bound_plan_internal.h"

namespace wsync::exec {

uint64_t PlanInstance::Next() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

namespace bind_internal {
namespace {

constexpr int64_t kStagingAlign = 64;

}  // namespace

absl::StatusOr<const v1::Reduce*> Binder::TakeReduce(const v1::Op& op, const std::string& where) {
  auto it = reduces_.find(op.reduce());
  if (it == reduces_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown reduce ", op.reduce()));
  }
  if (!seen_reduces_.insert(op.reduce()).second) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": reduce ", op.reduce(), " runs twice"));
  }
  return it->second;
}

absl::StatusOr<const v1::Quantize*> Binder::TakeQuantize(const v1::Op& op,
                                                         const std::string& where) {
  auto it = quantizes_.find(op.quantize());
  if (it == quantizes_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown quantize ", op.quantize()));
  }
  if (!seen_quantizes_.insert(op.quantize()).second) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": quantize ", op.quantize(), " runs twice"));
  }
  return it->second;
}

absl::StatusOr<const v1::Bucket*> Binder::TakeBucket(const v1::Op& op, int32_t round,
                                                     const std::string& where) {
  auto it = buckets_.find(op.bucket());
  if (it == buckets_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown bucket ", op.bucket()));
  }
  const v1::Bucket& b = *it->second;
  if (!seen_buckets_.insert(b.id()).second) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bucket ", b.id(), " runs twice"));
  }
  if (b.round() != round) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": bucket ", b.id(), " belongs to round ", b.round()));
  }
  const bool local = b.transport() == v1::TRANSPORT_LOCAL;
  bool ok = false;
  switch (op.kind()) {
    case v1::Op::SEND:
      ok = !local && b.sender() == worker_ && b.receiver() == op.peer() && op.peer() != worker_;
      break;
    case v1::Op::RECV:
      ok = !local && b.receiver() == worker_ && b.sender() == op.peer() && op.peer() != worker_;
      break;
    case v1::Op::COPY:
      ok = local && b.sender() == worker_ && b.receiver() == worker_;
      break;
    default:
      break;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": bucket ", b.id(), " (worker ", b.sender(), " -> ", b.receiver(), ", ",
        local ? "local" : "network", ") does not match this op (peer ", op.peer(), ")"));
  }
  if (local && b.route() == v1::ROUTE_PEER_WRITE) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": local bucket ", b.id(), " is routed PEER_WRITE"));
  }
  if (b.bytes() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative size"));
  const int32_t max_step = local ? 0 : kMaxBucketSteps - 1;
  if (b.step() < 0 || b.step() > max_step) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bucket ", b.id(), " has step ",
                                                   b.step(), ", outside [0, ", max_step, "]"));
  }
  return &b;
}

absl::Status Binder::BindPeerWrite(const v1::Op& op, const v1::Bucket& b, int32_t round) {
  if (op.kind() == v1::Op::SEND) {
    write_to_.insert(b.receiver());
    return BindPut(b, round, *bound_);
  }
  written_by_.insert(b.sender());
  return BindDirectRecv(b, round, *bound_);
}

absl::Status Binder::CollectOps(const v1::Round& round, RoundOps& ops) {
  for (int o = 0; o < round.ops_size(); ++o) {
    const v1::Op& op = round.ops(o);
    const std::string where = absl::StrCat("worker ", worker_, " round ", round.index(), " op ", o,
                                           " (", v1::Op::Kind_Name(op.kind()), ")");
    if (op.kind() == v1::Op::REDUCE) {
      ASSIGN_OR_RETURN(const v1::Reduce* r, TakeReduce(op, where));
      ops.reduces.push_back(r);
      continue;
    }
    if (op.kind() == v1::Op::QUANTIZE) {
      ASSIGN_OR_RETURN(const v1::Quantize* q, TakeQuantize(op, where));
      ops.quants.push_back(q);
      continue;
    }
    ASSIGN_OR_RETURN(const v1::Bucket* b, TakeBucket(op, round.index(), where));
    if (b->route() == v1::ROUTE_PEER_WRITE) {
      RETURN_IF_ERROR(BindPeerWrite(op, *b, round.index()));
      continue;
    }
    if (op.kind() == v1::Op::COPY) {
      ops.copies.push_back(b);
      continue;
    }
    BoundTransfer t;
    t.bucket = b->id();
    t.peer = op.peer();
    t.seq = b->seq();
    t.bytes = b->bytes();
    t.zero_copy = b->zero_copy();
    t.step = b->step();
    (op.kind() == v1::Op::SEND ? ops.sends : ops.recvs).push_back({t, b});
  }
  auto by_peer_seq = [](const auto& a, const auto& b) {
    return std::make_pair(a.first.peer, a.first.seq) < std::make_pair(b.first.peer, b.first.seq);
  };
  std::stable_sort(ops.sends.begin(), ops.sends.end(), by_peer_seq);
  std::stable_sort(ops.recvs.begin(), ops.recvs.end(), by_peer_seq);
  return absl::OkStatus();
}

absl::Status Binder::LayOutStaging(RoundOps& ops, BoundRound& out) {
  // Sends, then receives, back to back; aligned when that still fits the
  // plan's grant.
  for (int64_t align : {kStagingAlign, int64_t{1}}) {
    int64_t offset = 0;
    for (auto* list : {&ops.sends, &ops.recvs}) {
      for (auto& [t, b] : *list) {
        if (t.zero_copy) continue;
        // Bucket sizes come from the plan: refuse any that wrap.
        ASSIGN_OR_RETURN(offset, CheckedAdd(offset, (align - offset % align) % align,
                                            absl::StrCat("bucket ", t.bucket, " staging")));
        t.staging_offset = offset;
        ASSIGN_OR_RETURN(
            offset, CheckedAdd(offset, t.bytes, absl::StrCat("bucket ", t.bucket, " staging")));
      }
    }
    out.staging_bytes = offset;
    if (offset <= out.plan_staging_bytes) break;
  }
  if (out.staging_bytes > out.plan_staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_, " round ", out.index, ": staged buckets need ",
                     out.staging_bytes, " bytes but the plan grants ", out.plan_staging_bytes));
  }
  return absl::OkStatus();
}

constexpr size_t kMaxReserve = size_t{1} << 20;

absl::Status Binder::BindOps(RoundOps& ops, BoundRound& out) {
  std::map<std::pair<int64_t, int32_t>, Partial> partials;
  // At most one pack item per piece sent and one unpack item per piece
  // received: reserved, the items take their size rather than up to twice
  // it (a Kimi-K2 fsdp:256 worker binds 2.3 M of them).
  // At most 2^20 reserved, so that a hostile run's count costs nothing
  // before its first member is checked.
  size_t packs = 0, unpacks = 0;
  for (const auto& [t, b] : ops.sends) packs += PieceCount(*b).value_or(0);
  for (const auto& [t, b] : ops.recvs) unpacks += PieceCount(*b).value_or(0);
  out.pack.reserve(std::min(packs, kMaxReserve));
  out.unpack.reserve(std::min(unpacks, kMaxReserve));
  for (auto& [t, b] : ops.sends) {
    RETURN_IF_ERROR(BindSend(*b, t, out));
    out.bytes_sent += t.bytes;
    out.sends.push_back(t);
  }
  for (auto& [t, b] : ops.recvs) {
    RETURN_IF_ERROR(BindRecv(*b, t, out, partials));
    out.bytes_received += t.bytes;
    out.recvs.push_back(t);
  }
  for (const v1::Bucket* b : ops.copies) RETURN_IF_ERROR(BindCopy(*b, out.index, out, partials));
  for (const v1::Reduce* r : ops.reduces) {
    RETURN_IF_ERROR(BindReduce(*r, out.index, out, partials));
  }
  for (const v1::Quantize* q : ops.quants) RETURN_IF_ERROR(BindQuantize(*q, out.index, out));
  for (const auto& [key, part] : qparts_) {
    if (!part.consumed) {
      return absl::InvalidArgumentError(
          absl::StrCat(part.where, ": quantize input consumed by no quantize of this round"));
    }
  }
  for (const auto& [key, part] : partials) {
    if (!part.consumed) {
      return absl::InvalidArgumentError(
          absl::StrCat(part.where, ": partial piece consumed by no reduce of this round"));
    }
  }
  return absl::OkStatus();
}

absl::Status Binder::BindRound(const v1::Round& round, BoundRound& out) {
  out.index = round.index();
  out.plan_staging_bytes = round.staging_bytes();
  qparts_.clear();
  RoundOps ops;
  RETURN_IF_ERROR(CollectOps(round, ops));
  RETURN_IF_ERROR(LayOutStaging(ops, out));
  return BindOps(ops, out);
}

absl::StatusOr<std::shared_ptr<const BoundPlan>> Binder::Bind() {
  RETURN_IF_ERROR(CheckPlanRuns(plan_));  // every run, and their members together bounded
  // Every member of a run is bound as a piece of its own, read in place
  // (ForEachPiece) rather than written out: at Kimi-K2 fsdp:256 a
  // destination worker's 13 k records stand for 2.3 M pieces, 1 GB as
  // v1::Piece messages. Reduce, quantize and scale references index plain
  // pieces, which come first.
  for (const v1::Bucket& b : plan_.buckets()) {
    if (!buckets_.emplace(b.id(), &b).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan lists bucket ", b.id(), " twice"));
    }
  }
  for (const v1::Reduce& r : plan_.reduces()) {
    if (!reduces_.emplace(r.id(), &r).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan lists reduce ", r.id(), " twice"));
    }
  }
  for (const v1::Quantize& q : plan_.quantizes()) {
    if (!quantizes_.emplace(q.id(), &q).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan lists quantize ", q.id(), " twice"));
    }
  }
  auto bound = std::make_shared<BoundPlan>();
  bound_ = bound.get();
  if (direct_ != nullptr) {
    bound->ready_token = direct_->ready_token;
    bound->expected_ready_tokens = direct_->expected_ready_tokens;
  }
  bound->key = plan_.key();
  bound->worker = worker_;
  bound->registry_generation = registry_.generation();
  bound->space = space_;
  const v1::RankPlan* rank = nullptr;
  for (const v1::RankPlan& rp : plan_.ranks()) {
    if (rp.worker() != worker_) continue;
    if (rank != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan has two rank plans for worker ", worker_));
    }
    rank = &rp;
  }
  if (rank != nullptr) {
    int32_t prev = -1;
    for (const v1::Round& round : rank->rounds()) {
      if (round.index() <= prev) {
        return absl::InvalidArgumentError(
            absl::StrCat("worker ", worker_, ": round ", round.index(), " follows round ", prev));
      }
      prev = round.index();
      BoundRound br;
      RETURN_IF_ERROR(BindRound(round, br));
      bound->max_staging_bytes = std::max(bound->max_staging_bytes, br.staging_bytes);
      bound->total_bytes += br.bytes_sent + br.bytes_received + br.bytes_local;
      bound->rounds.push_back(std::move(br));
    }
  }
  bound->total_bytes += bound->bytes_put + bound->bytes_put_into;
  RETURN_IF_ERROR(
      Annotate(OrderPutsByPhase(*bound), absl::StrCat("worker ", worker_, ": put phases")));
  // The peers of its ROUTE_PEER_WRITE buckets (sorted): the ready and done
  // tokens go to them.
  bound->direct_write_to.assign(write_to_.begin(), write_to_.end());
  bound->direct_written_by.assign(written_by_.begin(), written_by_.end());
  // Every bucket and reduce of this worker must be run by its op list: a side
  // that silently skips one corrupts data on the other.
  for (const v1::Bucket& b : plan_.buckets()) {
    if ((b.sender() == worker_ || b.receiver() == worker_) && !seen_buckets_.count(b.id())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", b.id(), " (worker ", b.sender(), " -> ", b.receiver(), ", round ", b.round(),
          ") involves worker ", worker_, " but no op of its rank plan runs it"));
    }
  }
  for (const v1::Quantize& q : plan_.quantizes()) {
    if (q.worker() == worker_ && !seen_quantizes_.count(q.id())) {
      return absl::InvalidArgumentError(absl::StrCat("quantize ", q.id(), " of worker ", worker_,
                                                     " is run by no op of its rank plan"));
    }
  }
  for (const v1::Reduce& r : plan_.reduces()) {
    if (r.worker() == worker_ && !seen_reduces_.count(r.id())) {
      return absl::InvalidArgumentError(absl::StrCat("reduce ", r.id(), " of worker ", worker_,
                                                     " is run by no op of its rank plan"));
    }
  }
  return std::shared_ptr<const BoundPlan>(std::move(bound));
}

}  // namespace bind_internal

absl::StatusOr<std::shared_ptr<const BoundPlan>> BindPlan(const v1::Plan& plan, int32_t worker,
                                                          const BufferRegistry& registry,
                                                          MemorySpace space,
                                                          const DirectWrites* direct) {
  bind_internal::Binder binder(plan, worker, registry, space, direct);
  return binder.Bind();
}

}  // namespace wsync::exec
