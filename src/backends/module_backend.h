// A backend that lives in a shared library and is loaded (dlopen) the first time a model asks
// for it, so a heavy runtime costs nothing until then: Debian's LibTorch alone maps ~150 MiB
// and 300 shared libraries (OpenCV, GDAL, Qt) at load. The library exports
//   extern "C" inferd::backends::Backend* InferdCreateBackend();
// and resolves inferd's own symbols from the executable (built with exported symbols).
// A library that fails to load fails the model's load with dlerror's reason; it is not
// retried. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeModuleBackend(std::string name, std::string library_path);

// The directory holding the running executable (where the build puts backend libraries).
std::string ExecutableDirectory();

}  // namespace inferd::backends
