#include "config/model_files.h"

#include <filesystem>
#include <system_error>

#include "common/strings.h"
#include "config/model_config_util.h"

namespace inferd::config {
namespace fs = std::filesystem;
namespace {

// Triton's IsChildPathEscapingParentPath, inverted: `child` is `parent` or below it. Both are
// normalized; the comparison keeps the separator, so "/m/a-sibling" is not below "/m/a".
bool IsWithin(const fs::path& child, const fs::path& parent) {
  std::string c = child.lexically_normal().string();
  std::string p = parent.lexically_normal().string();
  while (c.size() > 1 && c.back() == '/') c.pop_back();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (c == p) return true;
  if (p == "/") return !c.empty() && c.front() == '/';
  return c.size() > p.size() && c.compare(0, p.size(), p) == 0 && c[p.size()] == '/';
}

}  // namespace

std::string ExpandModelDirectory(std::string value, const std::string& model_dir) {
  static constexpr std::string_view kToken = "$$TRITON_MODEL_DIRECTORY";
  for (size_t pos = value.find(kToken); pos != std::string::npos;
       pos = value.find(kToken, pos + model_dir.size())) {
    value.replace(pos, kToken.size(), model_dir);
  }
  return value;
}

absl::StatusOr<std::string> ResolveInside(const std::string& within, std::string_view field,
                                          std::string_view value) {
  if (value.find('\0') != std::string_view::npos) {
    // The reader's open() would stop at the NUL: the checked path is not the opened one.
    return absl::InvalidArgumentError(StrCat(field, " holds a NUL byte"));
  }
  const fs::path root = fs::absolute(fs::path(within)).lexically_normal();
  const fs::path v(value);
  const fs::path candidate = (v.is_absolute() ? v : root / v).lexically_normal();
  if (value.empty() || !IsWithin(candidate, root)) {
    return absl::InvalidArgumentError(StrCat(field, " '", value,
                                             "' names a file outside the model folder ('",
                                             root.string(), "'); it must lie inside it"));
  }
  // A link inside the folder may still point out: compare the real paths (of as much of the
  // path as exists). Of the path as the reader will open it, not the normalized one: the
  // kernel resolves "w/.." through a link `w` from wherever `w` leads (config_files_fuzz
  // found "w/../x" with w -> ../1 leaving warmup/ when checked normalized).
  // And of the normalized one too: where a component does not exist yet ("nothing/../etc"),
  // weakly_canonical stops resolving and normalizes the rest as text, which would step over
  // a link (`etc -> /etc`) the moment that component appears.
  std::error_code ec;
  const fs::path real_root = fs::weakly_canonical(root, ec);
  fs::path real = ec ? fs::path() : fs::weakly_canonical(candidate, ec);
  if (!ec && IsWithin(real, real_root)) {
    real = fs::weakly_canonical(v.is_absolute() ? v : root / v, ec);
  }
  if (ec || !IsWithin(real, real_root)) {
    return absl::InvalidArgumentError(StrCat(
        field, " '", value, "' resolves through a link to '", real.string(),
        "', outside the model folder ('", root.string(), "'); it must lie inside it"));
  }
  return real.string();
}

absl::Status CheckFilesInsideModel(const ModelConfig& cfg, const std::string& model_dir,
                                   const std::vector<int64_t>& versions) {
  auto check = [](const std::string& within, const std::string& field,
                  std::string_view value) -> absl::Status {
    if (value.empty()) return absl::OkStatus();
    return ResolveInside(within, field, value).status();
  };
  for (const auto& out : cfg.output()) {
    if (absl::Status st = check(model_dir, StrCat("output '", out.name(), "' label_filename"),
                                out.label_filename());
        !st.ok()) {
      return st;
    }
  }
  if (!cfg.default_model_filename().empty()) {
    // Checked against a version folder even when none exists yet (load API, auto-complete).
    std::vector<int64_t> vs = versions;
    if (vs.empty()) vs.push_back(1);
    for (int64_t v : vs) {
      if (absl::Status st = check(StrCat(model_dir, "/", v), "default_model_filename",
                                  cfg.default_model_filename());
          !st.ok()) {
        return st;
      }
    }
  }
  for (const auto& sample : cfg.model_warmup()) {
    for (const auto& [name, in] : sample.inputs()) {
      if (!in.has_input_data_file()) continue;
      if (absl::Status st = check(StrCat(model_dir, "/warmup"),
                                  StrCat("model_warmup '", sample.name(), "' input '", name,
                                         "' input_data_file"),
                                  in.input_data_file());
          !st.ok()) {
        return st;
      }
    }
  }
  for (const auto& state : cfg.sequence_batching().state()) {
    for (const auto& init : state.initial_state()) {
      if (!init.has_data_file()) continue;
      if (absl::Status st = check(StrCat(model_dir, "/initial_state"),
                                  StrCat("sequence_batching state '", state.input_name(),
                                         "' initial_state data_file"),
                                  init.data_file());
          !st.ok()) {
        return st;
      }
    }
  }
  if (auto env = GetParameter(cfg, "EXECUTION_ENV_PATH"); env && !env->empty()) {
    if (absl::Status st = check(model_dir, "parameters EXECUTION_ENV_PATH",
                                ExpandModelDirectory(*env, model_dir));
        !st.ok()) {
      return st;
    }
  }
  if (auto out = GetParameter(cfg, "optimized_model_filepath"); out && !out->empty()) {
    // ONNX Runtime writes it as given: relative would mean relative to the server's working
    // folder, so only an absolute path inside the model folder is taken.
    if (out->front() != '/') {
      return absl::InvalidArgumentError(StrCat(
          "parameters optimized_model_filepath '", *out,
          "' must be an absolute path inside the model folder ('", model_dir, "')"));
    }
    if (absl::Status st = check(model_dir, "parameters optimized_model_filepath", *out);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace inferd::config
