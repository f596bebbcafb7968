// Reading a model folder on disk: which version folders it has, and a fingerprint of its files
// so poll mode can tell what changed. (Which models a repository holds: source.h.)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::repository {

// Numeric version folders of a model, ascending. Non-numeric folders are ignored.
std::vector<int64_t> ListVersions(const std::string& model_dir);

// A string that changes when any file under `model_dir` is added, removed, resized or touched.
std::string Fingerprint(const std::string& model_dir);

}  // namespace inferd::repository
