// Per-stage cost of one plan build, for measurement (wsyncctl plan --stages,
// plan_bench): CPU time (user + sys), wall time and minor page faults of each
// planner stage, and the process's resident set at its end. Recording costs
// one getrusage and one /proc read per stage; nothing is recorded unless
// asked for.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_STAGES_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_STAGES_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace wsync::plan {

struct StageCost {
  std::string name;
  double cpu_seconds = 0;  // user + sys of the process during the stage
  double wall_seconds = 0;
  int64_t rss_bytes = 0;       // resident set at the stage's end
  int64_t peak_rss_bytes = 0;  // the process's peak so far (ru_maxrss)
  // Minor page faults of the process during the stage: each is a first touch
  // of a page (4 KiB, or 2 MiB where huge), in a VM the dearest part of
  // building a large plan.
  int64_t minor_faults = 0;
  bool aggregate = false;  // spans stages listed before it: not in the total
};

// Appends one StageCost per Mark to *out (nullptr: records nothing).
class StageClock {
 public:
  explicit StageClock(std::vector<StageCost>* out);
  // Closes the stage running since the last Mark (or construction) as `name`.
  void Mark(std::string name, bool aggregate = false);
  // Starts the next stage now, recording nothing for the time since the
  // last Mark (another clock measured it).
  void Skip();

 private:
  std::vector<StageCost>* out_;
  double cpu_ = 0;
  int64_t faults_ = 0;
  std::chrono::steady_clock::time_point wall_;
};

// The process's CPU seconds (user + sys) so far.
double ProcessCpuSeconds();

// The process's minor page faults so far.
int64_t ProcessMinorFaults();

// One line per stage: name, CPU, wall, minor faults, RSS at the end, peak RSS.
std::string StageTable(const std::vector<StageCost>& stages);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_STAGES_H_
