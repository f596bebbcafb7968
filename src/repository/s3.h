// Reading from S3 (or an S3-compatible endpoint) with libcurl's SigV4 signing. Credentials and
// region come from the standard AWS environment variables; AWS_ENDPOINT_URL (or the host:port
// of Triton's s3://host:port/bucket/prefix form) switches to that endpoint with path-style
// addressing.
//
// What is here: URL parsing, ListObjectsV2 (every page), HEAD, and two ways to GET an object:
// into a file, or streamed through gunzip and untar into a folder while it downloads. Objects
// above `S3TransferOptions::parallel_threshold` are fetched as ranged parts over several
// connections. Every error names the object ("s3://bucket/key") and says what happened: the
// HTTP status with S3's <Code> and <Message>, or curl's reason. Codes: NOT_FOUND (404),
// PERMISSION_DENIED (401/403), INVALID_ARGUMENT (400), FAILED_PRECONDITION (a redirect: wrong
// region or endpoint), UNAVAILABLE (unreachable, timed out, 5xx, the object changed while
// downloading), DATA_LOSS (fewer bytes than Content-Length).
//
// Thread-safety: every function may be called from any thread; none keeps state between calls
// except libcurl's per-thread connection reuse.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "repository/archive.h"

namespace inferd::repository {

struct S3Location {
  std::string bucket;
  std::string key;
};

// "s3://bucket/key" -> {bucket, key}. INVALID_ARGUMENT for anything else.
absl::StatusOr<S3Location> ParseS3Url(std::string_view url);

// A model repository in S3: s3://bucket[/prefix], or Triton's
// s3://[http://|https://]host:port/bucket[/prefix] (recognized by the host:port first
// component, which a bucket name cannot have). Repeated slashes collapse, as in Triton.
struct S3RepositoryUrl {
  std::string bucket;
  std::string prefix;    // "" (the whole bucket) or ends with '/'
  std::string endpoint;  // "http://host:port" from Triton's form; empty otherwise
};
absl::StatusOr<S3RepositoryUrl> ParseS3RepositoryUrl(std::string_view url);

// How transfers behave. The defaults are for production; tests shrink them.
struct S3TransferOptions {
  long connect_timeout_s = 10;
  // A transfer slower than low_speed_bytes per second for low_speed_seconds fails, so a
  // stalled server is an error instead of a hang.
  long low_speed_bytes = 1024;
  long low_speed_seconds = 30;
  int64_t parallel_threshold = int64_t{16} << 20;  // larger objects: ranged parallel GETs
  int64_t part_size = int64_t{8} << 20;
  int connections = 4;       // ranged GETs in flight for one object
  int retries = 2;           // per part or listing page, on UNAVAILABLE and DATA_LOSS
  int list_max_keys = 1000;  // ListObjectsV2 page size (S3's maximum)
};

struct S3Config {
  std::string access_key;            // AWS_ACCESS_KEY_ID
  std::string secret_key;            // AWS_SECRET_ACCESS_KEY
  std::string session_token;         // AWS_SESSION_TOKEN
  std::string region = "us-east-1";  // AWS_REGION, else AWS_DEFAULT_REGION
  std::string endpoint;  // AWS_ENDPOINT_URL (path-style); empty: AWS's virtual-hosted URL
  S3TransferOptions transfer;
};
S3Config S3ConfigFromEnvironment();

// The object's URL for `config` (path-style with an endpoint, virtual-hosted otherwise).
std::string S3ObjectUrl(const S3Config& config, const S3Location& location);
// A ListObjectsV2 request's URL: parameters sorted and fully percent-encoded, so the string is
// already SigV4's canonical query. No delimiter (s3rver drops nested prefixes with one).
std::string S3ListUrl(const S3Config& config, std::string_view bucket, std::string_view prefix,
                      std::string_view continuation_token, int max_keys);

// One object as a listing or a HEAD reports it.
struct S3Object {
  std::string key;
  std::string etag;  // without the quotes
  int64_t size = 0;
};

struct S3ListPage {
  std::vector<S3Object> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated
};
// Parses a ListObjectsV2 response body. INTERNAL when it is not one.
absl::StatusOr<S3ListPage> ParseListObjectsV2(std::string_view xml);

// One page of the objects under `prefix`. Errors name s3://bucket/prefix.
absl::StatusOr<S3ListPage> ListS3Page(const S3Config& config, const std::string& bucket,
                                      const std::string& prefix, const std::string& token,
                                      int max_keys);
// Every object under `prefix`, following NextContinuationToken.
absl::StatusOr<std::vector<S3Object>> ListS3Objects(const S3Config& config,
                                                    const std::string& bucket,
                                                    const std::string& prefix);

// The object's ETag and size.
absl::StatusOr<S3Object> HeadS3Object(const S3Config& config, const S3Location& location);

// The byte ranges an object of `size` bytes is fetched in: one part up to the parallel
// threshold, else `part_size` pieces.
struct S3Part {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive
};
std::vector<S3Part> PlanS3Parts(int64_t size, const S3TransferOptions& options);

// Downloads the object `info` describes (from HeadS3Object or a listing) into `path`, a new
// file (an existing file or link there is an error: O_EXCL | O_NOFOLLOW). Each part must come back with info.etag and its exact length. On
// error the file may hold part of the object: write to a temporary name and rename.
absl::Status DownloadS3Object(const S3Config& config, const S3Location& location,
                              const S3Object& info, const std::string& path);

// Streams the archive object `info` describes through libarchive into `dest_dir`
// (ExtractArchiveStream's rules): download, decompression and extraction overlap, and nothing
// but the extracted files is written. Memory stays below (connections + 1) parts. On error
// `dest_dir` may hold part of the archive: extract into a temporary folder and rename.
absl::Status ExtractS3Archive(const S3Config& config, const S3Location& location,
                              const S3Object& info, const std::string& dest_dir,
                              const ExtractLimits& limits);

}  // namespace inferd::repository
