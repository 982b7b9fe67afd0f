#ifndef WSYNC_COMMON_SERVICE_SIGNALS_H_
#define WSYNC_COMMON_SERVICE_SIGNALS_H_

#include <signal.h>

namespace wsync {

// The signal set-up the long-running binaries (wsync-controller,
// wsync-worker) share, called on the main thread before any other thread
// starts:
// - SIGINT and SIGTERM are blocked, in this thread and every thread started
//   after it, and returned: the caller takes them with sigwait(2), never in
//   an asynchronous handler;
// - SIGPIPE is ignored: a peer that dies mid-transfer resets its
//   connections, and writing to one must be an error (EPIPE), not the end
//   of the process;
// - a crash logs its stack trace (absl's failure signal handler, with the
//   symbolizer initialized from `argv0`).
sigset_t PrepareServiceSignals(const char* argv0);

}  // namespace wsync

#endif  // WSYNC_COMMON_SERVICE_SIGNALS_H_
