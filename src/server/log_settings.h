// The logging extension's settings (GET/POST /v2/logging, the LogSettings RPC), as
// tritonserver has them: log_file (read-only here, as in tritonserver), log_info, log_warning,
// log_error, log_verbose_level, log_format. An update changes what common/logging writes from
// then on.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"

namespace inferd::server {

struct LogSettingValue {
  enum Kind { kNull, kBool, kUint, kString, kOther } kind = kNull;
  bool b = false;
  uint64_t u = 0;
  std::string s;
};

struct LogSettingsView {
  std::string log_file;
  bool log_info = true;
  bool log_warning = true;
  bool log_error = true;
  uint32_t log_verbose_level = 0;
  std::string log_format;  // "default" or "ISO8601"
};

// Checks every field first and changes nothing when one is wrong (INVALID_ARGUMENT; a
// non-null log_file is UNIMPLEMENTED, as tritonserver). A null field is left as it is.
absl::Status UpdateLogSettings(const std::map<std::string, LogSettingValue>& settings);
LogSettingsView CurrentLogSettings();

}  // namespace inferd::server
