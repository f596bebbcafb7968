// Fuzzes what inferd reads from an S3 endpoint and from an s3:// URL: the ListObjectsV2 body
// (then the models a listing holds, and the key check every downloaded key passes) and the
// repository URL forms. A model name taken from a listing is never a path part, and a key the
// check accepts never climbs out of its model folder.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "repository/s3.h"
#include "repository/s3_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  (void)inferd::repository::ParseS3RepositoryUrl(input);
  auto page = inferd::repository::ParseListObjectsV2(input);
  if (!page.ok()) return 0;
  for (std::string_view prefix : {"", "models/", "a/b/"}) {
    for (const auto& m : inferd::repository::S3ModelsFromListing(prefix, page->objects)) {
      if (m.name.empty() || m.name == "." || m.name == ".." ||
          m.name.find('/') != std::string::npos) {
        abort();
      }
    }
  }
  for (const auto& o : page->objects) {
    if (!inferd::repository::CheckS3RelativeKey(o.key).ok()) continue;
    if (o.key.front() == '/' || o.key == ".." || o.key.rfind("../", 0) == 0 ||
        o.key.find("/../") != std::string::npos ||
        (o.key.size() >= 3 && o.key.compare(o.key.size() - 3, 3, "/..") == 0)) {
      abort();
    }
  }
  (void)inferd::repository::S3Fingerprint(page->objects);
  return 0;
}
