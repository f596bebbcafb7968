// Fuzzes config.pbtxt parsing, normalization and validation, and the JSON round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/model_config_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = inferd::config::ParseModelConfigText(text, "config.pbtxt");
  if (!cfg.ok()) return 0;
  if (inferd::config::NormalizeAndValidate(&*cfg, cfg->name().empty() ? "m" : cfg->name()).ok()) {
    std::string json = inferd::config::ModelConfigToJson(*cfg);
    (void)inferd::config::ParseModelConfigJson(json);
  }
  return 0;
}
