// The S3 repository source: s3://bucket/prefix and Triton's s3://host:port/bucket/prefix.
//
// Layout under the prefix is a local repository's: every first-level folder (a key prefix with
// objects below it) is a model, and a first-level .tar.gz/.tgz/.tar object is an archive model.
// List is one ListObjectsV2 walk (every page, no delimiter); a model's fingerprint hashes the
// key, ETag and size of each of its objects, so poll mode sees any changed object.
//
// Fetch makes a model local in the cache, `<cache_dir>/s3/<bucket>/<prefix, flattened>/`:
//   folder model   <name>@<fingerprint>/   its objects; files unchanged since the previous
//                                          snapshot are hard-linked from it, not downloaded
//   archive model  <name>@<ETag>/          the archive streamed through gunzip and untar
// A snapshot is built in a temporary folder, renamed into place, and then marked complete by
// `<snapshot>.done` (the folder's manifest), written last; a snapshot with its marker is a
// cache hit, also after a restart. Of a model's older snapshots the newest one is kept (it
// may still be loading or serving); the rest are removed.
//
// The repository must exist when it is opened: a missing bucket is NOT_FOUND, a refused one
// PERMISSION_DENIED, an unreachable endpoint UNAVAILABLE, each naming the URL. An existing
// bucket with nothing under the prefix is an empty repository (models may appear later, as in
// an empty local folder); Triton instead refuses a prefix with no objects.
//
// Thread-safety: List and Fetch may run on several threads at once; fetches of one model are
// serialized (the second finds the first one's snapshot), fetches of different models overlap.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "repository/s3.h"
#include "repository/source.h"

namespace inferd::repository {

absl::StatusOr<std::unique_ptr<Source>> MakeS3Source(const std::string& url,
                                                     const SourceOptions& options);

// The models a listing of `prefix` holds, sorted by name (see the layout above). First-level
// names that cannot be a folder name ("." and "..") are left out.
std::vector<SourceModel> S3ModelsFromListing(std::string_view prefix,
                                             const std::vector<S3Object>& objects);

// 16 hex digits that change whenever a key, ETag or size in `objects` (keys relative to the
// model) changes; the order of `objects` does not matter. Stable across runs and machines.
std::string S3Fingerprint(std::vector<S3Object> objects);

// OK when `relative` (a key below a model's folder, relative to it) names a file inside that
// folder: not empty, not absolute, no empty, "." or ".." segment, no control character.
// INVALID_ARGUMENT naming the key otherwise.
absl::Status CheckS3RelativeKey(std::string_view relative);

}  // namespace inferd::repository
