// The inferd side of bench/s3_cold_load.sh: opens an S3 model repository and fetches one model
// into an empty cache through repository::OpenSource, the path the model store takes (list,
// then download, gunzip and untar overlapped), and prints how long that took. Credentials and
// endpoint come from the AWS_* environment, as in inferd.
//
//   s3_fetch <s3://bucket/prefix> <model> <cache-dir>
//   -> fetch_ms <ms>  bytes <downloaded>  path <model folder>
//
// With --extract it only extracts a local archive with the same code (libarchive, zlib), the
// by-hand baseline that isolates what overlapping the download buys from tar's own gunzip:
//   s3_fetch --extract <archive> <dest>   -> extract_ms <ms>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "repository/archive.h"
#include "repository/s3.h"
#include "repository/source.h"

namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int ExtractOnly(const char* archive, const char* dest) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = inferd::repository::ExtractArchive(archive, dest);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("extract_ms %.1f\n", MsSince(start));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using inferd::repository::FetchStats;
  if (argc == 4 && std::string(argv[1]) == "--extract") return ExtractOnly(argv[2], argv[3]);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <s3://bucket/prefix> <model> <cache-dir>\n", argv[0]);
    return 2;
  }
  inferd::repository::SourceOptions options;
  options.cache_dir = argv[3];
  options.s3 = inferd::repository::S3ConfigFromEnvironment();
  // Transfer tuning to compare against the defaults: connections and the parallel threshold.
  if (const char* c = std::getenv("S3_FETCH_CONNECTIONS")) options.s3.transfer.connections = std::atoi(c);
  if (const char* t = std::getenv("S3_FETCH_THRESHOLD_MB")) {
    options.s3.transfer.parallel_threshold = int64_t{std::atoi(t)} << 20;
  }
  const auto start = std::chrono::steady_clock::now();
  auto source = inferd::repository::OpenSource(argv[1], options);
  if (!source.ok()) {
    std::fprintf(stderr, "%s\n", std::string(source.status().message()).c_str());
    return 1;
  }
  FetchStats stats;
  auto path = (*source)->Fetch(argv[2], &stats);
  const double ms = MsSince(start);
  if (!path.ok()) {
    std::fprintf(stderr, "%s\n", std::string(path.status().message()).c_str());
    return 1;
  }
  std::printf("fetch_ms %.1f\nbytes %lld\ncache_hit %d\npath %s\n", ms,
              static_cast<long long>(stats.bytes_downloaded), stats.cache_hit ? 1 : 0,
              path->c_str());
  return 0;
}
