#include "repository/repository_scan.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "common/strings.h"

namespace inferd::repository {

namespace fs = std::filesystem;

std::vector<int64_t> ListVersions(const std::string& model_dir) {
  std::vector<int64_t> versions;
  std::error_code ec;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    int64_t v;
    std::string name = it->path().filename().string();
    if (absl::SimpleAtoi(name, &v) && v >= 0 && name.find_first_not_of("0123456789") == std::string::npos) {
      versions.push_back(v);
    }
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

std::string Fingerprint(const std::string& model_dir) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(model_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code e2;
    auto status = it->status(e2);
    if (e2) continue;
    std::string rel = fs::relative(it->path(), model_dir, e2).string();
    if (fs::is_regular_file(status)) {
      auto size = fs::file_size(it->path(), e2);
      auto mtime = fs::last_write_time(it->path(), e2).time_since_epoch().count();
      entries.push_back(inferd::StrCat(rel, ":", size, ":", mtime));
    } else {
      entries.push_back(inferd::StrCat(rel, "/"));
    }
  }
  std::sort(entries.begin(), entries.end());
  std::string out;
  for (auto& e : entries) inferd::StrAppend(&out, e, "\n");
  return out;
}

}  // namespace inferd::repository
