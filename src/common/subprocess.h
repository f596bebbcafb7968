// Starting and reaping child processes without a shell: one posix_spawn with an argv vector and
// an explicit environment (no PATH search, no /bin/sh, nothing is parsed), the signal state reset
// in the child, and only the descriptors the caller names passed on (everything inferd opens is
// close-on-exec). The Python backend's stub processes and the DALI backend's dali.py serializer
// both start their interpreter through here.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd {

struct SpawnOptions {
  // The executable, run as given (an absolute path, or relative to the working directory).
  std::string program;
  // The whole argv, argv[0] included.
  std::vector<std::string> argv;
  // The child's whole environment, "NAME=value" each (see CurrentEnvironment).
  std::vector<std::string> env;
  // Descriptors passed on: {descriptor here, number in the child}. The descriptor here may be
  // close-on-exec (dup2 into the child clears the flag on the copy).
  std::vector<std::pair<int, int>> fds;
  // Opens /dev/null as the child's standard input (else it inherits inferd's).
  bool stdin_dev_null = false;
};

// Starts the process. The child gets an empty signal mask and every signal at its default
// disposition (inferd's main thread blocks SIGTERM/SIGINT for sigwait; a child must not inherit
// that). FAILED_PRECONDITION with strerror's text (e.g. "No such file or directory") when it
// cannot be started; the caller says what it was starting.
absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& options);

// Waits for `pid` to end (retrying on EINTR) and returns its wait status.
int WaitForExit(pid_t pid);

// SIGKILLs `pid` and reaps it; returns its wait status.
int KillAndReap(pid_t pid);

// inferd's environment as "NAME=value" strings, to filter and extend for a child.
std::vector<std::string> CurrentEnvironment();

// "exited with status 3", "was killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

}  // namespace inferd
