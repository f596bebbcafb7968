#include "server/log_settings.h"

#include <limits>
#include <optional>

#include "common/logging.h"
#include "common/strings.h"

namespace inferd::server {

absl::Status UpdateLogSettings(const std::map<std::string, LogSettingValue>& settings) {
  std::optional<bool> info, warning, error, iso;
  std::optional<int> verbose;
  for (const auto& [key, v] : settings) {
    if (v.kind == LogSettingValue::kNull) continue;
    if (key == "log_file") {
      return absl::UnimplementedError("log file location can not be updated through network protocol");
    }
    if (key == "log_info" || key == "log_warning" || key == "log_error") {
      if (v.kind != LogSettingValue::kBool) {
        return absl::InvalidArgumentError(StrCat("'", key, "' must be a boolean"));
      }
      (key == "log_info" ? info : key == "log_warning" ? warning : error) = v.b;
    } else if (key == "log_verbose_level") {
      if (v.kind != LogSettingValue::kUint || v.u > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return absl::InvalidArgumentError("'log_verbose_level' must be a non-negative integer");
      }
      verbose = static_cast<int>(v.u);
    } else if (key == "log_format") {
      if (v.kind != LogSettingValue::kString || (v.s != "default" && v.s != "ISO8601")) {
        return absl::InvalidArgumentError(
            StrCat("invalid argument for log_format, got: ", v.kind == LogSettingValue::kString ? v.s : "a non-string",
                   " (expected \"default\" or \"ISO8601\")"));
      }
      iso = v.s == "ISO8601";
    } else {
      return absl::InvalidArgumentError(
          StrCat("unknown log setting '", key,
                 "' (expected log_file, log_info, log_warning, log_error, log_verbose_level, log_format)"));
    }
  }
  if (info) SetLogLevelEnabled(LogLevel::kInfo, *info);
  if (warning) SetLogLevelEnabled(LogLevel::kWarning, *warning);
  if (error) SetLogLevelEnabled(LogLevel::kError, *error);
  if (verbose) SetLogVerbosity(*verbose);
  if (iso) SetLogFormatIso8601(*iso);
  return absl::OkStatus();
}

LogSettingsView CurrentLogSettings() {
  LogSettingsView v;
  v.log_file = LogFileName();
  v.log_info = LogEnabled(LogLevel::kInfo);
  v.log_warning = LogEnabled(LogLevel::kWarning);
  v.log_error = LogEnabled(LogLevel::kError);
  v.log_verbose_level = static_cast<uint32_t>(LogVerbosity());
  v.log_format = LogFormatIso8601() ? "ISO8601" : "default";
  return v;
}

}  // namespace inferd::server
