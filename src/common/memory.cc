#include "common/memory.h"

#include <dlfcn.h>
#include <malloc.h>

#include <cstddef>

namespace inferd {
namespace {

// tcmalloc's C entry points, found at run time (null on glibc's malloc).
struct Tcmalloc {
  using VoidFn = void (*)();
  using SetPropertyFn = int (*)(const char*, size_t);
  VoidFn release = reinterpret_cast<VoidFn>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"));
  SetPropertyFn set_property =
      reinterpret_cast<SetPropertyFn>(dlsym(RTLD_DEFAULT, "MallocExtension_SetNumericProperty"));
};

const Tcmalloc& GetTcmalloc() {
  static const Tcmalloc fns;
  return fns;
}

// The cap on all of tcmalloc's per-thread caches together (its default is 32 MiB). Loads and
// unloads free a model's small objects on threads that do not allocate them again, and those
// caches only grow until the cap: with 32 MiB, RSS rose by 6-8 KiB per load/unload cycle for
// thousands of cycles (bench/soak.py); with 8 MiB, 0.5 KiB. (Also flushing the unloading
// thread's cache, MallocExtension_MarkThreadIdle, made it worse: the objects then piled up in
// the transfer caches, 2.3 KiB per cycle.) A model's large blocks (batch buffers, activations,
// weights) are above the thread caches' size classes and are not affected.
constexpr size_t kThreadCacheBytes = size_t{8} << 20;

// Applied when the process starts, before any model loads.
[[maybe_unused]] const bool kThreadCacheCapped = [] {
  const Tcmalloc& fns = GetTcmalloc();
  return fns.set_property != nullptr &&
         fns.set_property("tcmalloc.max_total_thread_cache_bytes", kThreadCacheBytes) != 0;
}();

}  // namespace

void ReleaseFreeMemory() {
  const Tcmalloc& fns = GetTcmalloc();
  if (fns.release != nullptr) {
    fns.release();
  } else {
    malloc_trim(0);
  }
}

}  // namespace inferd
