#include "worker/agent/progress_reporter.h"

#include <utility>

namespace wsync::agent {

ProgressReporter::ProgressReporter(std::function<void(const v1::ReportProgressRequest&)> send)
    : send_(std::move(send)), thread_([this] { Loop(); }) {}

ProgressReporter::~ProgressReporter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ProgressReporter::Post(v1::ReportProgressRequest report) {
  absl::MutexLock lock(&mu_);
  next_ = std::move(report);
}

int ProgressReporter::pending() const {
  absl::MutexLock lock(&mu_);
  return next_.has_value() ? 1 : 0;
}

void ProgressReporter::Loop() {
  for (;;) {
    v1::ReportProgressRequest report;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || next_.has_value(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      report = std::move(*next_);
      next_.reset();
    }
    send_(report);
  }
}

}  // namespace wsync::agent
