// Model archives are extracted by common/archive.h (shared with the Python backend's packed
// environments); the repository layer's names for it.
#pragma once

#include "common/archive.h"

namespace inferd::repository {

using ::inferd::ArchiveChunkReader;
using ::inferd::ExtractArchive;
using ::inferd::ExtractArchiveStream;
using ::inferd::ExtractLimits;

}  // namespace inferd::repository
