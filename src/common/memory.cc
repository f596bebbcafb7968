#include "common/memory.h"

#include <dlfcn.h>
#include <malloc.h>

namespace inferd {

void ReleaseFreeMemory() {
  using ReleaseFn = void (*)();
  static const ReleaseFn tcmalloc_release =
      reinterpret_cast<ReleaseFn>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"));
  if (tcmalloc_release != nullptr) {
    tcmalloc_release();
  } else {
    malloc_trim(0);
  }
}

}  // namespace inferd
