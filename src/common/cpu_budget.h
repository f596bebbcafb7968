// How many CPUs this process may use: the container's CPU quota (cgroup v2 `cpu.max`, cgroup
// v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the tightest along the cgroup's ancestors), its
// `cpuset`, and the scheduler affinity mask, whichever is smallest. Default thread counts
// (event loops, backend intra-op threads) come from it, not from the host's core count: a
// container limited to one CPU on a 64-core host must not start 64 threads per pool.
#pragma once

#include <string>

namespace inferd {

struct CpuBudget {
  int cpus = 1;          // what the defaults use: at least 1
  int affinity = 0;      // sched_getaffinity's CPUs (0: unknown)
  int cpuset = 0;        // the cgroup's cpuset (0: none found)
  double quota = 0;      // the cgroup's CPU quota in CPUs (0: unlimited or none found)
  std::string describe;  // for the start-up log
};

// `proc_root` and `cgroup_root` are "/proc" and "/sys/fs/cgroup" outside tests.
CpuBudget DetectCpuBudget(const std::string& proc_root = "/proc",
                          const std::string& cgroup_root = "/sys/fs/cgroup");

// "0-3,8,10-11" -> 7. 0 for an empty or malformed list.
int CountCpuList(const std::string& list);

}  // namespace inferd
