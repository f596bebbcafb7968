// DetectCpuBudget against made-up /proc and /sys/fs/cgroup trees: cgroup v1 and v2 quotas (the
// tightest along the ancestors), cpusets, a namespaced view, and CPU-list parsing.
#include "common/cpu_budget.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace inferd {
namespace {
namespace fs = std::filesystem;

class CpuBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("inferd_cpu_budget_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "proc/self");
    fs::create_directories(root_ / "cgroup");
    cpu_set_t set;
    CPU_ZERO(&set);
    affinity_ = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  CpuBudget Detect() {
    return DetectCpuBudget((root_ / "proc").string(), (root_ / "cgroup").string());
  }
  fs::path root_;
  int affinity_ = 1;
};

TEST_F(CpuBudgetTest, NoCgroupIsTheAffinityMask) {
  Write("proc/self/cgroup", "0::/\n");
  const CpuBudget b = Detect();
  EXPECT_EQ(b.cpus, affinity_);
  EXPECT_EQ(b.quota, 0);
  EXPECT_NE(b.describe.find("affinity mask"), std::string::npos) << b.describe;
}

TEST_F(CpuBudgetTest, V1QuotaIsTheTightestAlongTheAncestors) {
  Write("proc/self/cgroup", "4:memory:/x\n1:cpu:/job/task\n3:cpuset:/\n");
  Write("cgroup/cpu/cpu.cfs_quota_us", "-1\n");
  Write("cgroup/cpu/cpu.cfs_period_us", "100000\n");
  Write("cgroup/cpu/job/cpu.cfs_quota_us", "50000\n");  // half a CPU on the parent
  Write("cgroup/cpu/job/cpu.cfs_period_us", "100000\n");
  Write("cgroup/cpu/job/task/cpu.cfs_quota_us", "300000\n");
  Write("cgroup/cpu/job/task/cpu.cfs_period_us", "100000\n");
  const CpuBudget b = Detect();
  EXPECT_DOUBLE_EQ(b.quota, 0.5);
  EXPECT_EQ(b.cpus, 1);
  EXPECT_NE(b.describe.find("quota of 0.5"), std::string::npos) << b.describe;
}

TEST_F(CpuBudgetTest, AFractionalQuotaRoundsUp) {
  Write("proc/self/cgroup", "1:cpu,cpuacct:/\n");
  Write("cgroup/cpu,cpuacct/cpu.cfs_quota_us", "150000\n");
  Write("cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const CpuBudget b = Detect();
  EXPECT_DOUBLE_EQ(b.quota, 1.5);
  EXPECT_EQ(b.cpus, std::min(affinity_, 2));
}

TEST_F(CpuBudgetTest, V2CpuMaxAndCpuset) {
  Write("proc/self/cgroup", "0::/pod/ctr\n");
  Write("cgroup/cgroup.controllers", "cpu cpuset\n");
  Write("cgroup/pod/cpu.max", "max 100000\n");
  Write("cgroup/pod/ctr/cpu.max", "100000 100000\n");
  Write("cgroup/pod/ctr/cpuset.cpus.effective", "0\n");
  const CpuBudget b = Detect();
  EXPECT_DOUBLE_EQ(b.quota, 1.0);
  EXPECT_EQ(b.cpuset, 1);
  EXPECT_EQ(b.cpus, 1);
}

TEST_F(CpuBudgetTest, ANamespacedViewReadsTheMountItself) {
  // Inside a container /proc/self/cgroup names the host's path, which is not visible.
  Write("proc/self/cgroup", "0::/kubepods/burstable/pod123/abc\n");
  Write("cgroup/cgroup.controllers", "cpu\n");
  Write("cgroup/cpu.max", "100000 100000\n");
  EXPECT_EQ(Detect().cpus, 1);
}

TEST_F(CpuBudgetTest, HybridHostUsesTheUnifiedMountForV2) {
  Write("proc/self/cgroup", "0::/svc\n");
  Write("cgroup/unified/svc/cpu.max", "100000 100000\n");
  EXPECT_EQ(Detect().cpus, 1);
}

TEST(CountCpuListTest, RangesAndSingles) {
  EXPECT_EQ(CountCpuList("0-3,8,10-11"), 7);
  EXPECT_EQ(CountCpuList("5"), 1);
  EXPECT_EQ(CountCpuList(""), 0);
  EXPECT_EQ(CountCpuList("3-1"), 0);
  EXPECT_EQ(CountCpuList("a-b"), 0);
}

}  // namespace
}  // namespace inferd
