// Fuzzes loading a model file through the ONNX Runtime backend the way the server does: the
// bytes become <dir>/m/1/model.onnx, the backend auto-completes a config that names only the
// backend, the config is normalized and validated, and an instance (an Ort::Session over the
// file, its inputs and outputs checked against the config) is created. Every step may fail;
// none may crash, hang or leak. Seeds: fuzz/make_seeds.py onnx_load_fuzz (small real models).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "backends/backend.h"
#include "backends/onnxruntime/onnxruntime_backend.h"
#include "config/model_config_util.h"

namespace {

std::string* fuzz_dir = nullptr;  // removed at exit

const std::string& ModelPath() {
  static const std::string* path = [] {
    char dir_template[] = "/tmp/onnx_load_fuzz.XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (dir == nullptr) std::abort();
    fuzz_dir = new std::string(dir);
    std::atexit([] { std::filesystem::remove_all(*fuzz_dir); });
    const std::string version_dir = *fuzz_dir + "/m/1";
    std::filesystem::create_directories(version_dir);
    return new std::string(version_dir + "/model.onnx");
  }();
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static inferd::backends::Backend* backend =
      inferd::backends::MakeOnnxRuntimeBackend().release();
  const std::string& path = ModelPath();
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  inferd::config::ModelConfig config;
  config.set_name("m");
  config.set_backend("onnxruntime");
  if (!backend->AutoCompleteConfig(path, &config).ok()) return 0;
  if (!inferd::config::NormalizeAndValidate(&config, "m").ok()) return 0;
  inferd::backends::ModelSpec spec;
  spec.config = &config;
  spec.version = 1;
  spec.version_dir = path.substr(0, path.rfind('/'));
  spec.model_dir = spec.version_dir.substr(0, spec.version_dir.rfind('/'));
  spec.model_path = path;
  spec.total_instances = 1;
  spec.cpu_cores = 1;
  inference::ModelInstanceGroup group;
  group.set_kind(inference::ModelInstanceGroup::KIND_CPU);
  group.set_count(1);
  auto instance = backend->CreateInstance(spec, group, 0);
  (void)instance;
  return 0;
}
