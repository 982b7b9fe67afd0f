#include "tools/demo/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::demo {

absl::StatusOr<Child> Child::Spawn(const std::vector<std::string>& argv,
                                   const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
    }
  }
  const pid_t pid = fork();
  if (pid < 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the parent may block signals
    if (log_fd >= 0) {
      dup2(log_fd, 1);
      dup2(log_fd, 2);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent: no race with an early signal
  if (log_fd >= 0) close(log_fd);
  Child c;
  c.pid_ = pid;
  return c;
}

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    Stop(absl::Seconds(3));
    pid_ = o.pid_;
    status_ = o.status_;
    o.pid_ = -1;
  }
  return *this;
}

bool Child::running() {
  if (pid_ <= 0) return false;
  int st = 0;
  const pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = st;
    pid_ = -1;
    return false;
  }
  return true;
}

void Child::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, &status_, 0);
  pid_ = -1;
}

void Child::Terminate() {
  if (running()) kill(-pid_, SIGTERM);
}

int Child::Stop(absl::Duration grace) {
  if (!running()) return status_;
  kill(-pid_, SIGTERM);
  const absl::Time until = absl::Now() + grace;
  while (absl::Now() < until) {
    if (!running()) return status_;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(-pid_, SIGKILL);
  waitpid(pid_, &status_, 0);
  pid_ = -1;
  return status_;
}

double CpuSecondsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos || paren + 2 > line.size()) return -1;
  std::istringstream fields(line.substr(paren + 2));
  std::string f;
  long long utime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stoll(f);
    if (i == 15) {
      return static_cast<double>(utime + std::stoll(f)) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return -1;
}

}  // namespace wsync::demo
