// The trace extension, as tritonserver has it (docs/trace_and_logging.md): a global trace
// setting (--trace-config) and per-model settings that override it field by field, changed at
// run time through /v2[/models/<m>]/trace/setting and the TraceSetting RPC. A sampled request
// carries a core::RequestTrace; when the request is destroyed its timestamps are appended to
// the setting's buffer and written to the trace file as tritonserver's JSON trace format:
// every `log_frequency` traces (and when `trace_count` traces are done) to "<file>.<n>", else
// to "<file>" when the setting is replaced or the server stops.
//
// Cost when nothing traces: Sample() is one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "core/infer_request.h"

namespace inferd::server {

enum TraceLevel : int { kTraceOff = 0, kTraceTimestamps = 1, kTraceTensors = 2 };

// The global setting at start (--trace-config; tritonserver's defaults).
struct TraceOptions {
  int level = kTraceOff;
  uint32_t rate = 1000;
  int32_t count = -1;  // -1: no limit
  uint32_t log_frequency = 0;
  std::string file;
};

// One setting in an update request: its values (trace_level may hold several), or null
// (JSON null; an empty value list over gRPC), which hands a model's field back to the global
// setting.
struct TraceSettingValue {
  bool null = false;
  std::vector<std::string> values;
};

class TraceManager {
 public:
  explicit TraceManager(const TraceOptions& global);
  ~TraceManager();

  // Checks an options set the way an update is checked: a level other than OFF needs a file
  // and a non-zero rate; TENSORS is refused (not implemented).
  static absl::Status Validate(const TraceOptions& options);

  // A trace for a request to `model` (its resolved version), or null when the request is not
  // sampled.
  std::unique_ptr<core::RequestTrace> Sample(const std::string& model, int64_t version,
                                             const std::string& request_id) {
    if (!active_.load(std::memory_order_relaxed)) return nullptr;
    return SampleSlow(model, version, request_id);
  }

  // Updates the global setting (model empty) or a model's. Errors are INVALID_ARGUMENT
  // (400) or UNIMPLEMENTED (trace_file, as tritonserver: 501 over HTTP).
  absl::Status Update(const std::string& model,
                      const std::map<std::string, TraceSettingValue>& settings);
  // The setting in force for `model` (the global one when it has none), as tritonserver
  // reports it: trace_level (a list), trace_rate, trace_count, log_frequency, trace_file,
  // trace_mode.
  std::vector<std::pair<std::string, std::vector<std::string>>> Describe(
      const std::string& model) const;

  // Writes out what was collected (the server's shutdown, after the models drained).
  void Shutdown();

  struct File;
  struct Setting;

 private:
  std::unique_ptr<core::RequestTrace> SampleSlow(const std::string& model, int64_t version,
                                                 const std::string& request_id);
  std::shared_ptr<File> FileFor(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshActive() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> active_{false};
  mutable inferd::Mutex mu_;
  std::shared_ptr<Setting> default_ ABSL_GUARDED_BY(mu_);  // the start-up setting
  std::shared_ptr<Setting> global_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Setting>> models_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::weak_ptr<File>> files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::server
