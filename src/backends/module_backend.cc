#include "backends/module_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace inferd::backends {
namespace {

class ModuleBackend : public Backend {
 public:
  ModuleBackend(std::string name, std::string path)
      : name_(std::move(name)), path_(std::move(path)) {}

  std::string_view name() const override { return name_; }

  absl::Status AutoCompleteConfig(const std::string& model_path,
                                  config::ModelConfig* config) override {
    auto backend = Loaded();
    if (!backend.ok()) return backend.status();
    return (*backend)->AutoCompleteConfig(model_path, config);
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    auto backend = Loaded();
    if (!backend.ok()) return backend.status();
    return (*backend)->CreateInstance(spec, group, index);
  }

  // Asked for every model placed on this backend, so the library loads here at the latest
  // (a library that cannot load cannot take a GPU instance either: its error says why).
  absl::Status GpuInstanceSupport() const override {
    auto backend = const_cast<ModuleBackend*>(this)->Loaded();
    if (!backend.ok()) return backend.status();
    return (*backend)->GpuInstanceSupport();
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstanceOn(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const InstanceDevice& device) override {
    auto backend = Loaded();
    if (!backend.ok()) return backend.status();
    return (*backend)->CreateInstanceOn(spec, group, index, device);
  }

 private:
  absl::StatusOr<Backend*> Loaded() {
    inferd::MutexLock lock(&mu_);
    if (backend_ != nullptr) return backend_.get();
    if (!error_.ok()) return error_;
    const auto start = std::chrono::steady_clock::now();
    // Never closed: the runtime's threads and static objects live until the process ends.
    void* handle = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error_ = absl::FailedPreconditionError(
          inferd::StrCat("backend '", name_, "' cannot be loaded from '", path_, "': ", dlerror()));
      LOG_ERROR << error_.message();
      return error_;
    }
    using Create = Backend* (*)();
    auto create = reinterpret_cast<Create>(dlsym(handle, "InferdCreateBackend"));
    if (create == nullptr) {
      error_ = absl::FailedPreconditionError(inferd::StrCat(
          "backend '", name_, "': '", path_, "' does not export InferdCreateBackend"));
      LOG_ERROR << error_.message();
      return error_;
    }
    backend_.reset(create());
    LOG_INFO << "loaded backend '" << name_ << "' from " << path_ << " in "
             << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
             << " s";
    return backend_.get();
  }

  const std::string name_;
  const std::string path_;
  inferd::Mutex mu_;
  std::unique_ptr<Backend> backend_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Backend> MakeModuleBackend(std::string name, std::string library_path) {
  return std::make_unique<ModuleBackend>(std::move(name), std::move(library_path));
}

std::string ExecutableDirectory() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

}  // namespace inferd::backends
