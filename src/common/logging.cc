#include "common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"

namespace inferd {
namespace {
std::atomic<int> g_verbose{0};
std::atomic<bool> g_iso{false};
std::atomic<bool> g_enabled[3] = {true, true, true};  // kError, kWarning, kInfo
inferd::Mutex g_file_mu;
std::string g_file_name ABSL_GUARDED_BY(g_file_mu);
}  // namespace

void SetLogVerbosity(int verbose) { g_verbose.store(verbose); }
void SetLogFormatIso8601(bool iso) { g_iso.store(iso); }
void SetLogLevelEnabled(LogLevel level, bool enabled) {
  if (level != LogLevel::kVerbose) g_enabled[static_cast<int>(level)].store(enabled);
}
int LogVerbosity() { return g_verbose.load(); }
bool LogFormatIso8601() { return g_iso.load(); }
void SetLogFileName(std::string_view name) {
  inferd::MutexLock lock(&g_file_mu);
  g_file_name.assign(name);
}
std::string LogFileName() {
  inferd::MutexLock lock(&g_file_mu);
  return g_file_name;
}
bool LogEnabled(LogLevel level) {
  if (level == LogLevel::kVerbose) return g_verbose.load(std::memory_order_relaxed) > 0;
  return g_enabled[static_cast<int>(level)].load(std::memory_order_relaxed);
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  gmtime_r(&tv.tv_sec, &t);
  static constexpr char kLetters[] = {'E', 'W', 'I', 'V'};
  const char* base = std::strrchr(file_, '/');
  base = base ? base + 1 : file_;
  std::string line;
  if (g_iso.load()) {
    line = absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02dZ %c %s:%d] %s\n", t.tm_year + 1900,
                           t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                           kLetters[static_cast<int>(level_)], base, line_, stream_.str());
  } else {
    line = absl::StrFormat("%c%02d%02d %02d:%02d:%02d.%06d %s:%d] %s\n",
                           kLetters[static_cast<int>(level_)], t.tm_mon + 1, t.tm_mday, t.tm_hour,
                           t.tm_min, t.tm_sec, static_cast<int>(tv.tv_usec), base, line_,
                           stream_.str());
  }
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace inferd
