// Handing freed heap memory back to the operating system.
#pragma once

namespace inferd {

// Returns the allocator's free pages to the kernel: tcmalloc's page heap when the binary runs
// on tcmalloc (found at run time, so libraries and tests on glibc's malloc need no link to
// it), else glibc's malloc_trim. Called after a model unloads, so the memory an unloaded or
// evicted model held shows up as a smaller RSS rather than staying cached in the allocator.
void ReleaseFreeMemory();

}  // namespace inferd
