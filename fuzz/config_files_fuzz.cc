// Fuzzes the config fields that name files (issue 27; config/model_files.h): the input is a
// config.pbtxt. Against a model folder that holds links pointing in and out of it, every
// file-naming field of a config that CheckFilesInsideModel accepts must resolve, links
// followed, inside the model folder (the version folder for default_model_filename).
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/model_config_util.h"
#include "config/model_files.h"

namespace fs = std::filesystem;

namespace {

// base/secret (outside), base/model-sibling/, base/model/{1/,warmup/,initial_state/} with
// links: in -> 1, up -> .., etc -> /etc, 1/out -> ../../model-sibling, warmup/w -> ../1.
const fs::path& Model() {
  static const fs::path model = [] {
    char tmpl[] = "/tmp/inferd_config_files_fuzz.XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) abort();
    const fs::path base(dir);
    const fs::path m = base / "model";
    for (const char* d : {"1", "warmup", "initial_state"}) fs::create_directories(m / d);
    fs::create_directories(base / "model-sibling");
    std::ofstream(base / "secret") << "secret\n";
    std::ofstream(m / "labels.txt") << "a\n";
    std::ofstream(m / "1" / "model.onnx") << "x";
    fs::create_directory_symlink("1", m / "in");
    fs::create_directory_symlink("..", m / "up");
    fs::create_directory_symlink("/etc", m / "etc");
    fs::create_directory_symlink("../../model-sibling", m / "1" / "out");
    fs::create_directory_symlink("../1", m / "warmup" / "w");
    fs::create_symlink("../secret", m / "secret-link");
    return fs::canonical(m);
  }();
  return model;
}

bool Inside(const fs::path& p, const fs::path& root) {
  std::error_code ec;
  const std::string real = fs::weakly_canonical(p, ec).string();
  if (ec) return true;  // a loop: it leads nowhere
  const std::string r = root.string();
  return real == r || real.rfind(r + "/", 0) == 0;
}

void Expect(bool ok, const std::string& field, const std::string& value) {
  if (!ok) {
    std::fprintf(stderr, "%s '%s' was accepted but resolves outside the model folder\n",
                 field.c_str(), value.c_str());
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& m = Model();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = inferd::config::ParseModelConfigText(text, "config.pbtxt");
  if (!cfg.ok()) {
    // Not a config: take the bytes as one field value.
    auto r = inferd::config::ResolveInside(m.string(), "label_filename", text);
    if (r.ok()) Expect(Inside(*r, m), "label_filename", text);
    return 0;
  }
  if (!inferd::config::CheckFilesInsideModel(*cfg, m.string(), {1}).ok()) return 0;
  for (const auto& out : cfg->output()) {
    if (out.label_filename().empty()) continue;
    Expect(Inside(m / out.label_filename(), m), "label_filename", out.label_filename());
  }
  if (!cfg->default_model_filename().empty()) {
    Expect(Inside(m / "1" / cfg->default_model_filename(), m / "1"), "default_model_filename",
           cfg->default_model_filename());
  }
  for (const auto& sample : cfg->model_warmup()) {
    for (const auto& [name, in] : sample.inputs()) {
      if (!in.has_input_data_file()) continue;
      Expect(Inside(m / "warmup" / in.input_data_file(), m / "warmup"), "input_data_file",
             in.input_data_file());
    }
  }
  for (const auto& state : cfg->sequence_batching().state()) {
    for (const auto& init : state.initial_state()) {
      if (!init.has_data_file()) continue;
      Expect(Inside(m / "initial_state" / init.data_file(), m / "initial_state"), "data_file",
             init.data_file());
    }
  }
  if (auto env = inferd::config::GetParameter(*cfg, "EXECUTION_ENV_PATH"); env && !env->empty()) {
    const std::string v = inferd::config::ExpandModelDirectory(*env, m.string());
    Expect(Inside(v.front() == '/' ? fs::path(v) : m / v, m), "EXECUTION_ENV_PATH", *env);
  }
  return 0;
}
