// The parts of one (writer, receiver) pair's direct writes with checksums
// (executor.h, PumpDirectParts): the writer issues its puts part by part, a
// mark after each, and posts each part's count as its mark is reached; the
// receiver hashes a part's buckets once its count arrives, so only the last
// part's hash follows the transfer. Both sides cut from the same bucket
// sizes with the same options, so they agree on every part.
#ifndef WSYNC_WORKER_EXEC_DIRECT_PARTS_H_
#define WSYNC_WORKER_EXEC_DIRECT_PARTS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace wsync::exec {

// The most parts a pair is cut into: a posted count has 16 bits.
inline constexpr int32_t kMaxDirectParts = 65535;

struct DirectPartCut {
  int32_t max_parts = 16;                      // clamped to [1, kMaxDirectParts]
  int64_t min_part_bytes = int64_t{64} << 20;  // parts are planned at least this large
  // <= 1: parts of about equal bytes (session 18). r > 1: the parts shrink
  // toward the end of the stream: from the end, the last part takes buckets
  // up to min_part_bytes (at least one bucket), the one before up to r times
  // the last part's bytes, and so on while such a part stays smaller than
  // an equal share of the buckets before it (and leaves them a part); those
  // are cut equally. A receiver that hashes faster than r times the link's
  // rate keeps up with every part, and only the small last part's hash
  // follows the transfer.
  int32_t tail_ratio = 0;
};

// The part of each bucket (`bytes`, in the pair's (round, seq) order, each
// >= 0): non-decreasing from 0, consecutive, cut at bucket boundaries only.
// The number of parts is the last value + 1 (at most max_parts; fewer where
// buckets are larger than the parts planned).
std::vector<int32_t> CutDirectParts(absl::Span<const int64_t> bytes, const DirectPartCut& cut);

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_DIRECT_PARTS_H_
