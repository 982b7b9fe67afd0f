#include "controller/server/worker_pages.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace wsync::controller {

absl::Status PageWorkers(v1::ListWorkersResponse all, const v1::ListWorkersRequest& req,
                         int32_t max_workers, int64_t max_buffers, v1::ListWorkersResponse* out) {
  out->Clear();
  int64_t start = 0;
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &start) || start < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListWorkers: page_token '", req.page_token(),
                     "' is not a next_page_token of this controller"));
  }
  if (req.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListWorkers: negative page_size ", req.page_size()));
  }
  const int32_t size = req.page_size() == 0 ? max_workers : std::min(req.page_size(), max_workers);
  const int64_t total = all.workers_size();
  int64_t next = start;
  int64_t buffers = 0;
  while (next < total && out->workers_size() < size) {
    v1::RegisteredWorker& w = *all.mutable_workers(static_cast<int>(next));
    const int64_t count = w.buffers_size();
    if (out->workers_size() > 0 && buffers + count > max_buffers) break;
    w.set_buffer_count(static_cast<int32_t>(count));
    if (count > max_buffers) {
      w.mutable_buffers()->DeleteSubrange(static_cast<int>(max_buffers),
                                          static_cast<int>(count - max_buffers));
      w.set_buffers_truncated(true);
    }
    buffers += w.buffers_size();
    *out->add_workers() = std::move(w);
    ++next;
  }
  if (next < total) out->set_next_page_token(absl::StrCat(next));
  return absl::OkStatus();
}

}  // namespace wsync::controller
