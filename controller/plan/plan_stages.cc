#include "controller/plan/plan_stages.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_format.h"

namespace wsync::plan {
namespace {

// Resident bytes now (/proc/self/statm's second field); 0 if unreadable.
int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

int64_t PeakResidentBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

int64_t ProcessMinorFaults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

StageClock::StageClock(std::vector<StageCost>* out) : out_(out) {
  if (out_ == nullptr) return;
  cpu_ = ProcessCpuSeconds();
  faults_ = ProcessMinorFaults();
  wall_ = std::chrono::steady_clock::now();
}

void StageClock::Mark(std::string name, bool aggregate) {
  if (out_ == nullptr) return;
  const double cpu = ProcessCpuSeconds();
  const int64_t faults = ProcessMinorFaults();
  const auto wall = std::chrono::steady_clock::now();
  StageCost s;
  s.name = std::move(name);
  s.cpu_seconds = cpu - cpu_;
  s.wall_seconds = std::chrono::duration<double>(wall - wall_).count();
  s.rss_bytes = ResidentBytes();
  s.peak_rss_bytes = PeakResidentBytes();
  s.minor_faults = faults - faults_;
  s.aggregate = aggregate;
  out_->push_back(std::move(s));
  // The reads above count towards the next stage: negligible.
  cpu_ = cpu;
  faults_ = faults;
  wall_ = wall;
}

void StageClock::Skip() {
  if (out_ == nullptr) return;
  cpu_ = ProcessCpuSeconds();
  faults_ = ProcessMinorFaults();
  wall_ = std::chrono::steady_clock::now();
}

std::string StageTable(const std::vector<StageCost>& stages) {
  std::string out = absl::StrFormat("  %-30s %9s %9s %9s %10s %10s\n", "stage", "cpu s", "wall s",
                                    "minflt", "rss MiB", "peak MiB");
  double cpu = 0, wall = 0;
  int64_t faults = 0;
  for (const StageCost& s : stages) {
    absl::StrAppendFormat(&out, "  %-30s %9.3f %9.3f %9d %10.0f %10.0f\n", s.name, s.cpu_seconds,
                          s.wall_seconds, s.minor_faults, s.rss_bytes / 1048576.0,
                          s.peak_rss_bytes / 1048576.0);
    if (s.aggregate) continue;
    cpu += s.cpu_seconds;
    wall += s.wall_seconds;
    faults += s.minor_faults;
  }
  absl::StrAppendFormat(&out, "  %-30s %9.3f %9.3f %9d\n", "total", cpu, wall, faults);
  return out;
}

}  // namespace wsync::plan
