#include "common/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"

namespace inferd {
namespace fs = std::filesystem;
namespace {

std::optional<std::string> ReadFirstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// The folders from `dir` up to `top` (both included), innermost first.
std::vector<fs::path> UpTo(fs::path dir, const fs::path& top) {
  std::vector<fs::path> out;
  for (;;) {
    out.push_back(dir);
    if (dir == top || !dir.has_relative_path() || dir.parent_path() == dir) break;
    const std::string rel = dir.lexically_relative(top).string();
    if (rel.empty() || rel == "." || rel.rfind("..", 0) == 0) break;
    dir = dir.parent_path();
  }
  return out;
}

// The cgroup folder of this process under `mount`, or the mount itself when the path is not
// visible there (a container's namespaced view shows its own cgroup as the root).
fs::path CgroupDir(const fs::path& mount, const std::string& path) {
  std::error_code ec;
  const fs::path dir = mount / fs::path(path).relative_path();
  return fs::is_directory(dir, ec) ? dir : mount;
}

// The tightest v1 CFS quota along the ancestors, in CPUs (0: none).
double V1Quota(const fs::path& mount, const std::string& path) {
  double best = 0;
  for (const auto& dir : UpTo(CgroupDir(mount, path), mount)) {
    auto quota = ReadFirstLine(dir / "cpu.cfs_quota_us");
    auto period = ReadFirstLine(dir / "cpu.cfs_period_us");
    int64_t q = 0, p = 0;
    if (!quota || !period || !absl::SimpleAtoi(*quota, &q) || !absl::SimpleAtoi(*period, &p) ||
        q <= 0 || p <= 0) {
      continue;
    }
    const double cpus = static_cast<double>(q) / static_cast<double>(p);
    if (best == 0 || cpus < best) best = cpus;
  }
  return best;
}

// The tightest v2 `cpu.max` along the ancestors, in CPUs (0: none).
double V2Quota(const fs::path& mount, const std::string& path) {
  double best = 0;
  for (const auto& dir : UpTo(CgroupDir(mount, path), mount)) {
    auto line = ReadFirstLine(dir / "cpu.max");
    if (!line) continue;
    std::vector<std::string> parts = absl::StrSplit(*line, ' ', absl::SkipEmpty());
    int64_t q = 0, p = 0;
    if (parts.size() != 2 || parts[0] == "max" || !absl::SimpleAtoi(parts[0], &q) ||
        !absl::SimpleAtoi(parts[1], &p) || q <= 0 || p <= 0) {
      continue;
    }
    const double cpus = static_cast<double>(q) / static_cast<double>(p);
    if (best == 0 || cpus < best) best = cpus;
  }
  return best;
}

int Cpuset(const fs::path& mount, const std::string& path,
           std::initializer_list<const char*> files) {
  for (const char* file : files) {
    if (auto line = ReadFirstLine(CgroupDir(mount, path) / file)) {
      if (int n = CountCpuList(*line); n > 0) return n;
    }
  }
  return 0;
}

}  // namespace

int CountCpuList(const std::string& list) {
  int count = 0;
  for (absl::string_view range : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    while (!range.empty() && range.front() == ' ') range.remove_prefix(1);
    while (!range.empty() && range.back() == ' ') range.remove_suffix(1);
    const size_t dash = range.find('-');
    int lo = 0, hi = 0;
    if (dash == absl::string_view::npos) {
      if (!absl::SimpleAtoi(range, &lo)) return 0;
      hi = lo;
    } else if (!absl::SimpleAtoi(range.substr(0, dash), &lo) ||
               !absl::SimpleAtoi(range.substr(dash + 1), &hi)) {
      return 0;
    }
    if (lo < 0 || hi < lo) return 0;
    count += hi - lo + 1;
  }
  return count;
}

CpuBudget DetectCpuBudget(const std::string& proc_root, const std::string& cgroup_root) {
  CpuBudget b;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) b.affinity = CPU_COUNT(&set);
  if (b.affinity <= 0) b.affinity = static_cast<int>(std::thread::hardware_concurrency());

  // /proc/self/cgroup: "<id>:<controllers>:<path>"; v1 names its controllers, v2 is "0::".
  std::string cpu_path, cpuset_path, v2_path;
  bool v1_cpu = false, v1_cpuset = false, v2 = false;
  std::ifstream in(fs::path(proc_root) / "self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':');
    const size_t c = a == std::string::npos ? a : line.find(':', a + 1);
    if (c == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, c - a - 1);
    const std::string path = line.substr(c + 1);
    if (controllers.empty()) {
      v2 = true;
      v2_path = path;
      continue;
    }
    for (absl::string_view ctl : absl::StrSplit(controllers, ',')) {
      if (ctl == "cpu") v1_cpu = true, cpu_path = path;
      if (ctl == "cpuset") v1_cpuset = true, cpuset_path = path;
    }
  }
  const fs::path root(cgroup_root);
  std::error_code ec;
  if (v1_cpu) {
    for (const char* mount : {"cpu", "cpu,cpuacct", "cpuacct,cpu"}) {
      if (fs::is_directory(root / mount, ec)) {
        b.quota = V1Quota(root / mount, cpu_path);
        break;
      }
    }
  }
  if (v1_cpuset && fs::is_directory(root / "cpuset", ec)) {
    b.cpuset = Cpuset(root / "cpuset", cpuset_path, {"cpuset.effective_cpus", "cpuset.cpus"});
  }
  if (v2) {
    // A pure v2 host mounts it at the root; a hybrid one under "unified".
    const fs::path mount = fs::exists(root / "cgroup.controllers", ec) ? root : root / "unified";
    if (b.quota == 0) b.quota = V2Quota(mount, v2_path);
    if (b.cpuset == 0) b.cpuset = Cpuset(mount, v2_path, {"cpuset.cpus.effective"});
  }

  int cpus = std::max(1, b.affinity);
  std::vector<std::string> why = {StrCat(b.affinity, " in the affinity mask")};
  if (b.cpuset > 0) {
    cpus = std::min(cpus, b.cpuset);
    why.push_back(StrCat(b.cpuset, " in the cgroup's cpuset"));
  }
  if (b.quota > 0) {
    cpus = std::min(cpus, std::max(1, static_cast<int>(std::ceil(b.quota - 1e-9))));
    std::ostringstream q;
    q << b.quota;
    why.push_back(StrCat("a cgroup CPU quota of ", q.str()));
  }
  b.cpus = std::max(1, cpus);
  b.describe = StrCat(b.cpus, " CPU(s): ", StrJoin(why, ", "));
  return b;
}

}  // namespace inferd
