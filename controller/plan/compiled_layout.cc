#include "controller/plan/compiled_layout.h"

#include <algorithm>

namespace wsync::plan {

Interval ChunkInterval(int64_t n, int64_t parts, int64_t index) {
  const int64_t chunk = parts > 0 ? (n + parts - 1) / parts : 0;
  const int64_t begin = std::min(n, index * chunk);
  const int64_t end = std::min(n, (index + 1) * chunk);
  return {begin, end};
}

}  // namespace wsync::plan
