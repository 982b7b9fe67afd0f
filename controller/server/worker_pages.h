// ListWorkers pages: a page answer stays within default client message
// limits whatever workers registered (issue 18: one worker with 100k buffers
// made the whole list exceed them).
#ifndef WSYNC_CONTROLLER_SERVER_WORKER_PAGES_H_
#define WSYNC_CONTROLLER_SERVER_WORKER_PAGES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// The page of `all` (sorted, as WorkerRegistry::ListWorkers returns it) that
// `req` asks for: from req.page_token (an offset; "" = 0), at most
// min(req.page_size or max_workers, max_workers) workers whose buffers
// total at most `max_buffers`. A page always holds at least one worker; one
// whose buffers alone exceed the budget is listed with its first
// `max_buffers` (buffers_truncated). Every worker carries buffer_count.
// INVALID_ARGUMENT for a token that is not one of ours or a negative size.
absl::Status PageWorkers(v1::ListWorkersResponse all, const v1::ListWorkersRequest& req,
                         int32_t max_workers, int64_t max_buffers, v1::ListWorkersResponse* out);

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_WORKER_PAGES_H_
