#include "server/trace.h"

#include <charconv>
#include <cstdio>
#include <limits>
#include <optional>

#include "common/logging.h"
#include "common/status_macros.h"
#include "common/strings.h"

namespace inferd::server {
namespace {

std::atomic<uint64_t> g_next_trace_id{1};

bool WriteWhole(const std::string& path, const char* mode, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

// One trace file name, shared by every setting that names it. The file itself is opened on
// the first write ("[" then the traces) and closed with "]" when no setting names it any more.
struct TraceManager::File {
  explicit File(std::string n) : name(std::move(n)) {}
  ~File() {
    if (started && !name.empty() && !WriteWhole(name, "a", "]")) {
      LOG_ERROR << "trace file '" << name << "': cannot write";
    }
  }
  // Indexed: "<name>.<n>", a whole JSON array; else appended to "<name>".
  void Save(const std::string& traces, bool indexed) {
    inferd::MutexLock lock(&mu);
    std::string path = name;
    std::string text;
    const char* mode = "a";
    if (indexed) {
      path = StrCat(name, ".", index++);
      text = StrCat("[", traces, "]");
      mode = "w";
    } else {
      text = StrCat(started ? "," : "[", traces);
      if (!started) mode = "w";
      started = true;
    }
    if (!WriteWhole(path, mode, text)) LOG_ERROR << "trace file '" << path << "': cannot write";
  }

  const std::string name;
  inferd::Mutex mu;
  uint64_t index = 0;
  bool started = false;
};

// One setting (the global one or a model's), with its sampling counters and the traces
// collected but not yet written. Replaced, never changed, by an update: traces in flight keep
// the setting they were sampled under.
struct TraceManager::Setting {
  int level = kTraceOff;
  uint32_t rate = 1000;
  int32_t count = -1;
  uint32_t log_frequency = 0;
  std::shared_ptr<File> file;
  // Which fields a model's setting sets itself (the others follow the global setting).
  bool level_set = false, rate_set = false, count_set = false, log_frequency_set = false;

  inferd::Mutex mu;
  uint64_t seen ABSL_GUARDED_BY(mu) = 0;
  uint64_t created ABSL_GUARDED_BY(mu) = 0;
  uint64_t collected ABSL_GUARDED_BY(mu) = 0;
  int32_t remaining ABSL_GUARDED_BY(mu) = -1;  // trace_count left
  std::string pending ABSL_GUARDED_BY(mu);     // comma-separated JSON objects
  uint32_t pending_traces ABSL_GUARDED_BY(mu) = 0;

  bool Enabled() const { return level != kTraceOff && rate != 0 && !file->name.empty(); }

  bool TakeSample() {
    inferd::MutexLock lock(&mu);
    if (remaining == 0) return false;
    if (++seen % rate != 0) return false;
    if (remaining > 0) --remaining;
    ++created;
    return true;
  }

  void Write(const std::string& trace) {
    std::string out;
    {
      inferd::MutexLock lock(&mu);
      if (pending_traces != 0) pending.push_back(',');
      pending.append(trace);
      ++pending_traces;
      ++collected;
      // tritonserver writes "<file>.<n>" every log_frequency traces, and once the count is
      // used up and every sampled trace is in.
      if ((log_frequency != 0 && pending_traces >= log_frequency) ||
          (remaining == 0 && collected == created)) {
        out.swap(pending);
        pending_traces = 0;
      }
    }
    if (!out.empty()) file->Save(out, /*indexed=*/true);
  }

  ~Setting() {
    inferd::MutexLock lock(&mu);
    if (pending_traces != 0) file->Save(pending, /*indexed=*/log_frequency != 0);
  }
};

namespace {

class Trace final : public core::RequestTrace {
 public:
  Trace(std::shared_ptr<TraceManager::Setting> setting, uint64_t id, std::string model,
        int64_t version, std::string request_id)
      : setting_(std::move(setting)),
        id_(id),
        model_(std::move(model)),
        version_(version),
        request_id_(std::move(request_id)) {}

  void Finish(const core::InferRequest& request, uint64_t end_ns) override {
    // tritonserver's layout: one object naming the model, then one object per timestamp.
    const std::string id = StrCat(id_);
    std::string out = StrCat("{\"id\":", id, ",\"model_name\":");
    AppendJsonString(&out, model_);
    out += StrCat(",\"model_version\":", version_);
    if (!request_id_.empty()) {
      out += ",\"request_id\":";
      AppendJsonString(&out, request_id_);
    }
    out += "}";
    const core::RequestTimes& t = request.times;
    auto stamp = [&](const char* name, uint64_t ns) {
      if (ns == 0) return;  // a stage the request never reached (a cache hit, an error)
      out += StrCat(",{\"id\":", id, ",\"timestamps\":[{\"name\":\"", name, "\",\"ns\":", ns, "}]}");
    };
    stamp("REQUEST_START", t.received_ns);
    stamp("QUEUE_START", t.queue_start_ns);
    stamp("COMPUTE_START", t.compute_start_ns);
    stamp("COMPUTE_INPUT_END", t.compute_input_end_ns);
    stamp("COMPUTE_OUTPUT_START", t.compute_output_start_ns);
    stamp("COMPUTE_END", t.compute_end_ns);
    stamp("REQUEST_END", end_ns);
    setting_->Write(out);
  }

 private:
  std::shared_ptr<TraceManager::Setting> setting_;
  uint64_t id_;
  std::string model_;
  int64_t version_;
  std::string request_id_;
};

absl::Status ParseUnsigned(const std::string& key, const std::string& text, uint64_t max,
                           uint64_t* out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, *out);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && p == end && *out > max)) {
    return absl::InvalidArgumentError(StrCat("Unable to parse '", key,
                                             "', value is out of range [ 0, ", max, " ], got: ",
                                             text));
  }
  if (ec != std::errc() || p != end || text.empty()) {
    return absl::InvalidArgumentError(StrCat("Unable to parse '", key, "', got: ", text));
  }
  return absl::OkStatus();
}

std::string LevelError() {
  return "trace_level TENSORS is not supported by this server (only OFF and TIMESTAMPS)";
}

}  // namespace

TraceManager::TraceManager(const TraceOptions& global) {
  inferd::MutexLock lock(&mu_);
  default_ = std::make_shared<Setting>();
  default_->level = global.level;
  default_->rate = global.rate;
  default_->count = global.count;
  default_->remaining = global.count;
  default_->log_frequency = global.log_frequency;
  default_->file = FileFor(global.file);
  global_ = default_;
  RefreshActive();
}

TraceManager::~TraceManager() { Shutdown(); }

absl::Status TraceManager::Validate(const TraceOptions& o) {
  if ((o.level & kTraceTensors) != 0) return absl::InvalidArgumentError(LevelError());
  if (o.level == kTraceOff) return absl::OkStatus();
  if (o.rate == 0) return absl::InvalidArgumentError("trace rate must be non-zero");
  if (o.file.empty()) {
    return absl::InvalidArgumentError(
        "tracing at level TIMESTAMPS needs a trace file (--trace-config triton,file=<path>)");
  }
  return absl::OkStatus();
}

std::shared_ptr<TraceManager::File> TraceManager::FileFor(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) {
    if (auto file = it->second.lock()) return file;
  }
  auto file = std::make_shared<File>(name);
  files_[name] = file;
  return file;
}

void TraceManager::RefreshActive() {
  bool any = global_ != nullptr && global_->Enabled();
  for (const auto& [name, s] : models_) any |= s->Enabled();
  active_.store(any, std::memory_order_relaxed);
}

std::unique_ptr<core::RequestTrace> TraceManager::SampleSlow(const std::string& model,
                                                             int64_t version,
                                                             const std::string& request_id) {
  std::shared_ptr<Setting> setting;
  {
    inferd::MutexLock lock(&mu_);
    auto it = models_.find(model);
    setting = it != models_.end() ? it->second : global_;
  }
  if (setting == nullptr || !setting->Enabled() || !setting->TakeSample()) return nullptr;
  return std::make_unique<Trace>(std::move(setting), g_next_trace_id.fetch_add(1), model, version,
                                 request_id);
}

absl::Status TraceManager::Update(const std::string& model,
                                  const std::map<std::string, TraceSettingValue>& settings) {
  // Parse everything first: a request with one bad field changes nothing.
  std::optional<int> level;
  std::optional<uint32_t> rate, log_frequency;
  std::optional<int32_t> count;
  bool clear_level = false, clear_rate = false, clear_count = false, clear_frequency = false;
  for (const auto& [key, value] : settings) {
    const bool one = value.values.size() == 1;
    if (key == "trace_file") {
      return absl::UnimplementedError("trace file location can not be updated through network protocol");
    }
    if (key == "trace_mode") {
      if (value.null || (one && value.values[0] == "triton")) continue;
      return absl::InvalidArgumentError(
          "trace_mode can not be updated through network protocol (this server traces in "
          "mode 'triton' only)");
    }
    if (key == "trace_level") {
      if (value.null) {
        clear_level = true;
        continue;
      }
      int l = kTraceOff;
      for (const std::string& v : value.values) {
        if (v == "OFF") {
          if (value.values.size() != 1) {
            return absl::InvalidArgumentError("Expect only one trace level 'OFF' is specified");
          }
        } else if (v == "TIMESTAMPS") {
          l |= kTraceTimestamps;
        } else if (v == "TENSORS") {
          return absl::InvalidArgumentError(LevelError());
        } else {
          return absl::InvalidArgumentError(
              StrCat("unknown trace_level '", v, "': expected OFF, TIMESTAMPS or TENSORS"));
        }
      }
      if (value.values.empty()) return absl::InvalidArgumentError("trace_level names no level");
      level = l;
      continue;
    }
    if (key != "trace_rate" && key != "trace_count" && key != "log_frequency") {
      return absl::InvalidArgumentError(
          StrCat("unknown trace setting '", key,
                 "' (expected trace_level, trace_rate, trace_count, log_frequency)"));
    }
    if (value.null) {
      (key == "trace_rate" ? clear_rate : key == "trace_count" ? clear_count : clear_frequency) = true;
      continue;
    }
    if (!one) return absl::InvalidArgumentError(StrCat("'", key, "' takes one value"));
    const std::string& text = value.values[0];
    if (key == "trace_count") {
      // -1: no limit; tritonserver's minimum.
      if (text == "-1") {
        count = -1;
        continue;
      }
      uint64_t n = 0;
      absl::Status st = ParseUnsigned(key, text, std::numeric_limits<int32_t>::max(), &n);
      if (!st.ok()) {
        if (!text.empty() && text[0] == '-') {
          return absl::InvalidArgumentError(
              StrCat("Unable to parse 'trace_count'. Expecting value >= -1, got:", text));
        }
        return st;
      }
      count = static_cast<int32_t>(n);
      continue;
    }
    uint64_t n = 0;
    RETURN_IF_ERROR(ParseUnsigned(key, text, std::numeric_limits<uint32_t>::max(), &n));
    (key == "trace_rate" ? rate : log_frequency) = static_cast<uint32_t>(n);
  }

  inferd::MutexLock lock(&mu_);
  // Builds the new setting for `name` ("" global): a field given now, else the field the
  // setting set before (unless cleared), else the fallback's (the global setting for a model,
  // the start-up setting for the global one).
  auto build = [&](const std::string& name, bool apply)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::shared_ptr<Setting> {
    const bool global = name.empty();
    const Setting* current = global_.get();
    const Setting* fallback = default_.get();
    if (!global) {
      auto it = models_.find(name);
      current = it != models_.end() ? it->second.get() : nullptr;
      fallback = global_.get();
    }
    auto s = std::make_shared<Setting>();
    s->file = fallback->file;
    Setting* sp = s.get();
    auto pick = [&](const auto& given, bool clear, auto Setting::*field, bool Setting::*field_set) {
      if (apply && given.has_value()) {
        sp->*field = *given;
        sp->*field_set = true;
      } else if (apply && clear) {
        sp->*field = fallback->*field;
        sp->*field_set = global;
      } else if (current != nullptr && (global || current->*field_set)) {
        sp->*field = current->*field;
        sp->*field_set = true;
      } else {
        sp->*field = fallback->*field;
        sp->*field_set = global;
      }
    };
    pick(level, clear_level, &Setting::level, &Setting::level_set);
    pick(rate, clear_rate, &Setting::rate, &Setting::rate_set);
    pick(count, clear_count, &Setting::count, &Setting::count_set);
    pick(log_frequency, clear_frequency, &Setting::log_frequency, &Setting::log_frequency_set);
    // The count left: a count given now starts over; an unchanged one carries on.
    int32_t remaining = s->count;
    if (!(apply && (count.has_value() || clear_count)) && current != nullptr &&
        current->count == s->count) {
      Setting* cur = const_cast<Setting*>(current);
      inferd::MutexLock l(&cur->mu);
      remaining = cur->remaining;
    }
    {
      inferd::MutexLock l(&s->mu);
      s->remaining = remaining;
    }
    return s;
  };

  if (global_ == nullptr) return absl::UnavailableError("the server is shutting down");
  auto s = build(model, /*apply=*/true);
  if (s->level != kTraceOff) {
    if (s->rate == 0) {
      return absl::InvalidArgumentError("Attempting to set invalid trace setting :sample rate must be non-zero");
    }
    if (s->file->name.empty()) {
      return absl::InvalidArgumentError(
          "Attempting to set invalid trace setting :trace file name is not given (start the "
          "server with --trace-config triton,file=<path>)");
    }
  }
  if (model.empty()) {
    global_ = std::move(s);
    // Models that set only some fields follow the global setting in the others.
    for (auto& [name, ms] : models_) {
      if (!(ms->level_set && ms->rate_set && ms->count_set && ms->log_frequency_set)) {
        ms = build(name, /*apply=*/false);
      }
    }
  } else if (!s->level_set && !s->rate_set && !s->count_set && !s->log_frequency_set) {
    models_.erase(model);  // nothing of its own: the model follows the global setting
  } else {
    models_[model] = std::move(s);
  }
  RefreshActive();
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<std::string>>> TraceManager::Describe(
    const std::string& model) const {
  std::shared_ptr<Setting> s;
  {
    inferd::MutexLock lock(&mu_);
    auto it = models_.find(model);
    s = it != models_.end() ? it->second : global_;
  }
  if (s == nullptr) return {};
  std::vector<std::string> level;
  if (s->level == kTraceOff) level.push_back("OFF");
  if (s->level & kTraceTimestamps) level.push_back("TIMESTAMPS");
  int32_t count;
  {
    inferd::MutexLock lock(&s->mu);
    count = s->remaining;  // tritonserver reports the traces still to collect
  }
  return {{"trace_level", level},
          {"trace_rate", {StrCat(s->rate)}},
          {"trace_count", {StrCat(count)}},
          {"log_frequency", {StrCat(s->log_frequency)}},
          {"trace_file", {s->file->name}},
          {"trace_mode", {"triton"}}};
}

void TraceManager::Shutdown() {
  std::shared_ptr<Setting> global, def;
  std::map<std::string, std::shared_ptr<Setting>> models;
  {
    inferd::MutexLock lock(&mu_);
    active_.store(false, std::memory_order_relaxed);
    global.swap(global_);
    def.swap(default_);
    models.swap(models_);
  }
  // Dropping the last references writes what each setting collected and closes the files.
}

}  // namespace inferd::server
