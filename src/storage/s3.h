// Reading model archives from S3 (or an S3-compatible endpoint) with libcurl's SigV4 signing.
// Credentials and region come from the standard AWS environment variables; AWS_ENDPOINT_URL
// switches to that endpoint with path-style addressing. Objects are downloaded once into a
// local cache keyed by their ETag and checked against their Content-Length.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace inferd::storage {

struct S3Location {
  std::string bucket;
  std::string key;
};

// "s3://bucket/key" -> {bucket, key}. INVALID_ARGUMENT for anything else.
absl::StatusOr<S3Location> ParseS3Url(std::string_view url);

struct S3Config {
  std::string access_key;     // AWS_ACCESS_KEY_ID
  std::string secret_key;     // AWS_SECRET_ACCESS_KEY
  std::string session_token;  // AWS_SESSION_TOKEN
  std::string region = "us-east-1";  // AWS_REGION, else AWS_DEFAULT_REGION
  std::string endpoint;       // AWS_ENDPOINT_URL (path-style); empty: AWS's virtual-hosted URL
};
S3Config S3ConfigFromEnvironment();

// The object's URL for `config` (path-style with an endpoint, virtual-hosted otherwise).
std::string S3ObjectUrl(const S3Config& config, const S3Location& location);

// Downloads the object into `cache_dir` unless the cache already holds this ETag; returns the
// local file's path. NOT_FOUND for a missing object, PERMISSION_DENIED for 401/403,
// UNAVAILABLE for network failures, DATA_LOSS for a short download.
absl::StatusOr<std::string> FetchS3Object(const S3Config& config, const S3Location& location,
                                          const std::string& cache_dir, bool* cache_hit = nullptr);

}  // namespace inferd::storage
