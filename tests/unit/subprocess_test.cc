#include "common/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd {
namespace {

// Reads `fd` to end of stream.
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return out;
    }
  }
}

TEST(SubprocessTest, ChildGetsExactlyTheGivenEnvironmentAndDescriptors) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  SpawnOptions options;
  options.program = "/usr/bin/env";
  options.argv = {"env"};
  options.env = {"A=1", "B=two words; $(not a shell)"};
  options.fds = {{fds[1], 1}};
  options.stdin_dev_null = true;
  absl::StatusOr<pid_t> pid = SpawnProcess(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  close(fds[1]);
  EXPECT_EQ(ReadAll(fds[0]), "A=1\nB=two words; $(not a shell)\n");
  close(fds[0]);
  EXPECT_EQ(DescribeWaitStatus(WaitForExit(*pid)), "exited with status 0");
}

TEST(SubprocessTest, ExitStatusIsReported) {
  SpawnOptions options;
  options.program = "/bin/false";
  options.argv = {"false"};
  absl::StatusOr<pid_t> pid = SpawnProcess(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(DescribeWaitStatus(WaitForExit(*pid)), "exited with status 1");
}

TEST(SubprocessTest, MissingProgramIsFailedPreconditionWithTheCause) {
  SpawnOptions options;
  options.program = "/nonexistent/inferd-no-such-program";
  options.argv = {"x"};
  absl::StatusOr<pid_t> pid = SpawnProcess(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pid.status().message(), testing::HasSubstr("No such file"));
}

TEST(SubprocessTest, NoPathSearch) {
  SpawnOptions options;
  options.program = "true";  // not looked up on PATH: there is no ./true
  options.argv = {"true"};
  options.env = {"PATH=/usr/bin:/bin"};
  EXPECT_FALSE(SpawnProcess(options).ok());
}

TEST(SubprocessTest, KillAndReapEndsAndReapsTheChild) {
  SpawnOptions options;
  options.program = "/bin/sleep";
  options.argv = {"sleep", "600"};
  absl::StatusOr<pid_t> pid = SpawnProcess(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_THAT(DescribeWaitStatus(KillAndReap(*pid)),
              testing::StartsWith("was killed by signal 9"));
  int status = 0;
  EXPECT_EQ(waitpid(*pid, &status, WNOHANG), -1);  // already reaped
}

}  // namespace
}  // namespace inferd
