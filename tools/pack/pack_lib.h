// inferd-pack's pieces, apart from main() so that they can be tested on their own: the
// command line, which folders go into an archive (a model, or an ensemble and the models it
// runs), renaming a model in its config.pbtxt without reformatting it, writing a reproducible
// .tar.gz in the layout SageMaker's Triton multi-model endpoint expects (the model folder at
// the archive's top, or the ensemble and its parts side by side), and the S3 upload.
//
// Validation (loading the model as the server would) is main()'s job: it needs the backends
// and the server, which these functions do not link.
//
// Every function is thread-compatible (no shared state) except UploadToS3, which is
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "repository/s3.h"

namespace inferd::pack {

struct PackOptions {
  std::string input;        // a model folder, or a repository folder holding the model
  std::string model;        // --model: which model of a repository folder (default: SageMaker's pick)
  std::string output_dir = ".";
  int copies = 1;           // --copies
  std::string name_prefix;  // --name-prefix: copy i is named <prefix><i>
  std::string upload;       // --upload s3://bucket/prefix/
  bool auto_complete = true;
  std::string backend_directory;  // where libinferd_backend_pytorch.so is (default: beside the tool)
  bool verbose = false;     // the server's log on stderr while validating
  bool help = false;
};

// Parses argv[1..]. INVALID_ARGUMENT with a message for the user.
absl::StatusOr<PackOptions> ParsePackArgs(const std::vector<std::string>& args);
std::string PackUsage();

// What goes into an archive: the served model's folder and, for an ensemble, the folders of
// the models it runs (recursively), all in one repository folder.
struct PackPlan {
  std::string repository;          // the folder holding the model folders
  std::string model;               // the served model's folder name
  std::vector<std::string> parts;  // composing models, in the order first met
};

// `input` is a model folder (config.pbtxt or a numeric version folder) or a repository folder.
// In a repository folder `model` picks the model; empty, the one SageMaker would serve from an
// archive of the whole folder (repository::ChooseModelFolder: the only model, or the ensemble).
// Composing models that are not in the folder are left out; the validation names them.
absl::StatusOr<PackPlan> PlanPack(const std::string& input, const std::string& model);

// The archive names: `model` once, or <prefix>0 .. <prefix><copies-1>.
std::vector<std::string> ArchiveModelNames(const PackOptions& options, const std::string& model);

// Rewrites config.pbtxt text: the top-level `name` becomes `new_name` (added when absent), and
// in `ensemble_scheduling { step [...] }` each `model_name` found in `step_renames` is renamed.
// Everything else (comments, layout, order) is kept byte for byte. The result is parsed again
// and compared field by field with the original plus the renames; INVALID_ARGUMENT naming
// `file_name` when the text does not parse, INTERNAL if the edit went wrong.
absl::StatusOr<std::string> RenameModelConfig(std::string_view text, std::string_view file_name,
                                              const std::string& new_name,
                                              const std::map<std::string, std::string>& step_renames);

// One model folder in an archive: `source_dir`'s files under `name_in_archive/`, with
// config.pbtxt replaced by `config_text` when set (a renamed copy).
struct ArchiveMember {
  std::string name_in_archive;
  std::string source_dir;
  std::optional<std::string> config_text;
};

// Writes a gzip-compressed tar to `path` (through a temporary file, renamed when complete).
// Reproducible: entries sorted, owner root, modes 0755/0644, times zero, no gzip timestamp,
// so the same input gives the same bytes (and the same S3 ETag, which the server's cache keys
// on). Symbolic links are followed; names starting with '.' are left out; sockets, devices and
// FIFOs are refused. Returns the number of files written.
absl::StatusOr<int64_t> WriteModelArchive(const std::vector<ArchiveMember>& members,
                                          const std::string& path);

// "s3://bucket/prefix/" (or Triton's s3://host:port/bucket/prefix) and an archive's file name
// -> the object's location; the endpoint of Triton's form, if any, replaces the config's.
absl::StatusOr<repository::S3Location> UploadLocation(std::string_view url,
                                                      std::string_view file_name,
                                                      repository::S3Config* config);

struct UploadResult {
  std::string etag;  // as S3 returned it, without quotes
  int64_t bytes = 0;
};
// PUTs the file at `path` to `location`, signed with SigV4 (libcurl's CURLOPT_AWS_SIGV4) when
// credentials are set, with the payload's SHA-256 in x-amz-content-sha256 and its MD5 in
// Content-MD5 (S3 refuses a body that does not match). Errors name s3://bucket/key and carry
// S3's <Code> and <Message>. Objects over 5 GiB (S3's single-PUT limit) are refused.
absl::StatusOr<UploadResult> UploadToS3(const repository::S3Config& config,
                                        const repository::S3Location& location,
                                        const std::string& path);

// Lowercase hex SHA-256 of a file's contents.
absl::StatusOr<std::string> FileSha256(const std::string& path);

}  // namespace inferd::pack
