// Safe extraction of model archives (.tar.gz, and anything else libarchive reads): entries
// that would leave the destination (absolute paths, "..", links pointing outside), devices and
// FIFOs are refused, and the total size and entry count are capped. A corrupt archive is an
// INVALID_ARGUMENT error with libarchive's reason.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace inferd::storage {

struct ExtractLimits {
  uint64_t max_total_bytes = uint64_t{16} << 30;  // 16 GiB of file contents
  uint64_t max_entries = 100000;
};

// Extracts `archive_path` into `dest_dir` (created if missing; must be empty or absent).
absl::Status ExtractArchive(const std::string& archive_path, const std::string& dest_dir,
                            const ExtractLimits& limits = {});

}  // namespace inferd::storage
