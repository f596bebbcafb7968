// Reading a Triton model repository from disk: which models exist, where, which version
// folders they have, and a fingerprint of their files so poll mode can tell what changed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::repository {

struct ModelLocation {
  std::string name;
  std::string dir;  // <repository>/<name>
};

// Every model folder under the repositories. A name found in two repositories is an error
// reported for that model only (in `duplicates`).
struct ScanResult {
  std::map<std::string, ModelLocation> models;
  std::map<std::string, std::string> duplicates;  // name -> reason
};
ScanResult ScanRepositories(const std::vector<std::string>& repositories);

// Numeric version folders of a model, ascending. Non-numeric folders are ignored.
std::vector<int64_t> ListVersions(const std::string& model_dir);

// A string that changes when any file under `model_dir` is added, removed, resized or touched.
std::string Fingerprint(const std::string& model_dir);

// True for names that could escape the repository ("..", "/", empty, NUL).
bool IsSafeModelName(std::string_view name);

}  // namespace inferd::repository
