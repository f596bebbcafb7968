// Fuzzes the SageMaker binary+json content-type parser: the first 8 bytes give the body size,
// the rest is the Content-Type value. A header size it accepts never exceeds the body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "frontends/sagemaker/sagemaker_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t body_size;
  std::memcpy(&body_size, data, 8);
  body_size %= (uint64_t{1} << 40);
  std::string_view content_type(reinterpret_cast<const char*>(data + 8), size - 8);
  auto parsed = inferd::sagemaker::ParseSageMakerContentType(content_type, body_size);
  if (parsed.ok() && parsed->has_value() && **parsed > body_size) abort();
  return 0;
}
