// Fuzzes model-archive extraction (.tar.gz and whatever else libarchive reads) with small
// limits: whatever the bytes, extraction ends in a status (never a crash), nothing appears
// beside the destination, and no link inside it resolves outside it.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "repository/archive.h"

namespace fs = std::filesystem;

static const fs::path& Base() {
  static const fs::path base = [] {
    char tmpl[] = "/tmp/inferd_archive_fuzz.XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) abort();
    return fs::path(dir);
  }();
  return base;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& base = Base();
  const fs::path in = base / "in.bin";
  const fs::path out = base / "out";
  {
    std::ofstream f(in, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  inferd::repository::ExtractLimits limits;
  limits.max_total_bytes = 8 << 20;
  limits.max_entries = 256;
  (void)inferd::repository::ExtractArchive(in.string(), out.string(), limits);

  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    if (e.path() != in && e.path() != out) {
      std::fprintf(stderr, "extraction wrote %s beside the destination\n", e.path().c_str());
      abort();
    }
  }
  const fs::path root = fs::weakly_canonical(out, ec);
  for (auto it = fs::recursive_directory_iterator(out, fs::directory_options::none, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_symlink()) continue;
    const fs::path target = fs::weakly_canonical(it->path(), ec);
    if (ec) continue;
    const std::string t = target.string(), r = root.string() + "/";
    if (t.rfind(r, 0) != 0 && t != root.string()) {
      std::fprintf(stderr, "link %s resolves outside the destination: %s\n", it->path().c_str(), t.c_str());
      abort();
    }
  }
  fs::remove_all(out, ec);
  return 0;
}
