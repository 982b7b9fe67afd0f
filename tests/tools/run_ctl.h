// Runs the wsyncctl binary of this build (WSYNCCTL_PATH) as a subprocess,
// for the tests of tests/tools.
#ifndef WSYNC_TESTS_TOOLS_RUN_CTL_H_
#define WSYNC_TESTS_TOOLS_RUN_CTL_H_

#include <stdio.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace wsync::tools_testing {

struct CtlResult {
  int code = -1;    // the exit status; -1 if it died of a signal
  std::string out;  // stdout, and stderr when merged
};

// Runs a shell command line; returns its exit status and stdout.
inline CtlResult RunShell(const std::string& cmd) {
  CtlResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `wsyncctl <args>`, its stderr merged into `out` (`merge`) or dropped.
inline CtlResult RunCtl(const std::string& args, bool merge = true) {
  return RunShell(absl::StrCat(WSYNCCTL_PATH, " ", args, merge ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace wsync::tools_testing

#endif  // WSYNC_TESTS_TOOLS_RUN_CTL_H_
