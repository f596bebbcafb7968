// Minimal leveled logging to stderr, in tritonserver's formats: "default" (I1122 10:59:00.123456
// file:line] msg) or "ISO8601". Thread-safe; one write(2) per line.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace inferd {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kVerbose = 3 };

void SetLogVerbosity(int verbose);     // --log-verbose: 0 hides kVerbose lines.
void SetLogFormatIso8601(bool iso);    // --log-format=ISO8601
// --log-error / --log-warning / --log-info=false drop the lines of that level (not kVerbose,
// which only SetLogVerbosity controls).
void SetLogLevelEnabled(LogLevel level, bool enabled);
bool LogEnabled(LogLevel level);
// Current values, for the logging extension (GET /v2/logging, LogSettings).
int LogVerbosity();
bool LogFormatIso8601();
// --log-file's name ("" when lines go to stderr), reported by the logging extension.
void SetLogFileName(std::string_view name);
std::string LogFileName();

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace inferd

#define INFERD_LOG(level)                                              \
  if (!::inferd::LogEnabled(::inferd::LogLevel::level)) {              \
  } else                                                               \
    ::inferd::LogMessage(::inferd::LogLevel::level, __FILE__, __LINE__).stream()

#define LOG_ERROR INFERD_LOG(kError)
#define LOG_WARNING INFERD_LOG(kWarning)
#define LOG_INFO INFERD_LOG(kInfo)
#define LOG_VERBOSE INFERD_LOG(kVerbose)
