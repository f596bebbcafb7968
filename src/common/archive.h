// Safe extraction of model archives (.tar.gz, and anything else libarchive reads): entries
// that would leave the destination (absolute paths, "..", links pointing outside), devices and
// FIFOs are refused, and the total size and entry count are capped. A corrupt archive is an
// INVALID_ARGUMENT error with libarchive's reason.
//
// Every directory, file and link is created beneath a descriptor of the destination
// (common/rooted_dir.h: openat2 with RESOLVE_BENEATH), so no entry can leave it whatever the
// entries before it created: the kernel, not a check of the entry's text, decides where a path
// through earlier links lands. Links are kept only where they resolve inside from where they
// sit (RootedDir::CreateSymlink), so the extracted tree holds no way out for its readers.
// In `common` rather than `repository` because the Python backend extracts packed
// environments (EXECUTION_ENV_PATH) with the same rules.
//
// Two ways in, one set of rules (one implementation of them): a file on disk
// (`ExtractArchive`, on the calling thread only, as the fuzzer wants), or a stream of chunks
// (`ExtractArchiveStream`), which lets a download feed gunzip and untar while it is still
// arriving, with no temporary archive on disk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferd {

struct ExtractLimits {
  uint64_t max_total_bytes = uint64_t{16} << 30;  // 16 GiB of file contents
  uint64_t max_entries = 100000;
  // Keep links whose target leaves the destination (a packed Python environment's
  // bin/python3 -> /usr/bin/python3.11). Nothing is ever written through such a link (the
  // extraction resolves beneath the destination); only the archive's later readers follow it,
  // so set it only where those readers may read anything anyway.
  bool keep_links_out = false;
};

// Extracts `archive_path` into `dest_dir` (created if missing; must be empty or absent).
absl::Status ExtractArchive(const std::string& archive_path, const std::string& dest_dir,
                            const ExtractLimits& limits = {});

// Supplies an archive's bytes in order: the next chunk, an empty view at the end, or an error.
// A chunk must stay valid until the next call (libarchive reads it in place).
using ArchiveChunkReader = std::function<absl::StatusOr<std::string_view>()>;

// Extracts the archive `read` yields into `dest_dir`, with ExtractArchive's rules; `what`
// names the archive in messages ("s3://bucket/model.tar.gz"). Two stages overlap: a helper
// thread calls `read` and decompresses (gunzip, or whatever filter the bytes carry) into a
// bounded pipe (4 MiB), and the calling thread untars from it and writes the files. The
// stream is read to its end even past the archive's end marker, so a short or failed stream
// is always an error; an error from `read` is returned as it is (a failed download, not a
// corrupt archive). When the extraction fails before the stream ends, `cancel` (if set) is
// called so that a `read` waiting for bytes returns (with an error) instead of waiting on.
// `read` is called from the helper thread only, one call at a time.
absl::Status ExtractArchiveStream(const ArchiveChunkReader& read, std::string_view what,
                                  const std::string& dest_dir, const ExtractLimits& limits = {},
                                  const std::function<void()>& cancel = nullptr);

}  // namespace inferd
