#include "tools/perf/perf_lib.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace inferd::perf {
namespace {

absl::Status Bad(std::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

std::optional<int64_t> ToInt(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

std::string Fmt(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

double ServerTotal(const ServerBreakdown& s) {
  return s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int64_t> Range::Values() const {
  std::vector<int64_t> v;
  for (int64_t x = start; x <= end; x += step) v.push_back(x);
  return v;
}

absl::StatusOr<Range> ParseRange(std::string_view text, std::string_view flag) {
  auto parts = Split(text, ':');
  Range r;
  std::vector<int64_t> n;
  for (auto p : parts) {
    auto v = ToInt(p);
    if (!v) break;
    n.push_back(*v);
  }
  if (parts.size() > 3 || n.size() != parts.size()) {
    return Bad(std::string("--") + std::string(flag) + " takes start[:end[:step]] with integers, got '" +
               std::string(text) + "'");
  }
  r.start = n[0];
  r.end = n.size() > 1 ? n[1] : n[0];
  r.step = n.size() > 2 ? n[2] : 1;
  if (r.start < 1 || r.end < r.start || r.step < 1) {
    return Bad(std::string("--") + std::string(flag) +
               " needs 1 <= start <= end and step >= 1, got '" + std::string(text) + "'");
  }
  return r;
}

absl::StatusOr<std::pair<std::string, std::vector<int64_t>>> ParseShape(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return Bad("--shape takes name:d1,d2,... , got '" + std::string(text) + "'");
  }
  std::vector<int64_t> dims;
  for (auto d : Split(text.substr(colon + 1), ',')) {
    auto v = ToInt(d);
    if (!v || *v < 1) {
      return Bad("--shape '" + std::string(text) + "': dimension '" + std::string(d) +
                 "' is not an integer >= 1");
    }
    dims.push_back(*v);
  }
  return std::make_pair(std::string(text.substr(0, colon)), dims);
}

std::string Usage() {
  return R"(Usage: inferd-perf -m <model> [options]
Measures a KServe v2 server (inferd, Triton, ...) over HTTP or gRPC, perf_analyzer style.

  -m <model>                      model name (required)
  -x <version>                    model version (default: the server's choice)
  -u <host:port>                  server (default localhost:8000 for http, :8001 for grpc)
  -i http|grpc                    protocol (default http: binary tensor extension)
  --http-json                     send JSON tensors instead of the binary extension
  --input-tensor-format binary|json   perf_analyzer's spelling of the same (default binary)
  --shared-memory none|system     system: tensors through registered POSIX shared memory
  --output-shared-memory-size <b> bytes of shared memory per output (default 102400)
  -b <n>                          batch size (default 1)
  --shape <name:d1,d2,...>        shape of an input with variable dims (no batch dim; repeatable)
  --input-data zero|random|<file> request data; file: perf_analyzer's JSON (default random)
  --concurrency-range <a:b:c>     closed loop: a..b concurrent requests, step c (default 1)
  --request-rate-range <a:b:c>    open loop: requests per second
  --request-distribution constant|poisson   open-loop send times (default constant)
  --max-threads <n>               open-loop sending threads (default 16)
  --measurement-interval, -p <ms> window length (default 5000)
  --stability-percentage, -s <p>  windows agree within p % (default 10)
  --max-trials, -r <n>            windows per step before giving up on stability (default 10)
  --percentile <p>                stabilize and report on the p-th latency percentile
  --warmup-request-count <n>      requests sent before measuring (default 0)
  -f <file.csv>                   perf_analyzer-style CSV
  --report <file.html>            self-contained HTML report with plots
  --sync, --async, -a, --verbose-csv   accepted as perf_analyzer's, change nothing: a step
                                  keeps N requests in flight from N threads; the CSV always
                                  has the verbose columns
)";
}

absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  Options o;
  using Setter = std::function<absl::Status(const std::string&)>;
  auto integer = [](const char* name, int64_t min, int64_t* out) -> Setter {
    return [name, min, out](const std::string& v) -> absl::Status {
      auto n = ToInt(v);
      if (!n || *n < min) {
        return Bad(std::string(name) + " takes an integer >= " + std::to_string(min) + ", got '" + v + "'");
      }
      *out = *n;
      return absl::OkStatus();
    };
  };
  auto text = [](std::string* out) -> Setter {
    return [out](const std::string& v) { *out = v; return absl::OkStatus(); };
  };
  std::map<std::string, Setter> with_value = {
      {"-m", text(&o.model)},
      {"--model-name", text(&o.model)},
      {"-x", text(&o.version)},
      {"--model-version", text(&o.version)},
      {"-u", text(&o.url)},
      {"--url", text(&o.url)},
      {"-i", [&](const std::string& v) -> absl::Status {
         std::string p = v;
         std::transform(p.begin(), p.end(), p.begin(), ::tolower);
         if (p != "http" && p != "grpc") return Bad("-i takes http or grpc, got '" + v + "'");
         o.protocol = p;
         return absl::OkStatus();
       }},
      {"--protocol", nullptr},
      {"-b", integer("-b", 1, &o.batch)},
      {"--batch-size", integer("--batch-size", 1, &o.batch)},
      {"--shape", [&](const std::string& v) -> absl::Status {
         auto s = ParseShape(v);
         if (!s.ok()) return s.status();
         o.shapes[s->first] = s->second;
         return absl::OkStatus();
       }},
      {"--input-data", text(&o.input_data)},
      {"--concurrency-range", [&](const std::string& v) -> absl::Status {
         auto r = ParseRange(v, "concurrency-range");
         if (!r.ok()) return r.status();
         o.concurrency = *r;
         return absl::OkStatus();
       }},
      {"--request-rate-range", [&](const std::string& v) -> absl::Status {
         auto r = ParseRange(v, "request-rate-range");
         if (!r.ok()) return r.status();
         o.request_rate = *r;
         return absl::OkStatus();
       }},
      {"--request-distribution", [&](const std::string& v) -> absl::Status {
         if (v != "constant" && v != "poisson") {
           return Bad("--request-distribution takes constant or poisson, got '" + v + "'");
         }
         o.distribution = v;
         return absl::OkStatus();
       }},
      {"--max-threads", integer("--max-threads", 1, &o.max_threads)},
      {"--measurement-interval", integer("--measurement-interval", 100, &o.measurement_interval_ms)},
      {"-p", integer("-p", 100, &o.measurement_interval_ms)},
      {"--stability-percentage", [&](const std::string& v) -> absl::Status {
         char* end = nullptr;
         double d = std::strtod(v.c_str(), &end);
         if (v.empty() || *end != '\0' || !(d > 0)) {
           return Bad("--stability-percentage takes a number > 0, got '" + v + "'");
         }
         o.stability_percentage = d;
         return absl::OkStatus();
       }},
      {"--max-trials", integer("--max-trials", 1, &o.max_trials)},
      {"-r", integer("-r", 1, &o.max_trials)},
      {"--input-tensor-format", [&](const std::string& v) -> absl::Status {
         if (v != "binary" && v != "json") {
           return Bad("--input-tensor-format takes binary or json, got '" + v + "'");
         }
         o.http_json = v == "json";
         return absl::OkStatus();
       }},
      {"--percentile", [&](const std::string& v) -> absl::Status {
         auto n = ToInt(v);
         if (!n || *n < 1 || *n > 99) return Bad("--percentile takes an integer 1..99, got '" + v + "'");
         o.percentile = *n;
         return absl::OkStatus();
       }},
      {"--warmup-request-count", integer("--warmup-request-count", 0, &o.warmup_requests)},
      {"--shared-memory", [&](const std::string& v) -> absl::Status {
         if (v != "none" && v != "system") {
           return Bad("--shared-memory takes none or system (CUDA shared memory is not supported), got '" + v + "'");
         }
         o.shared_memory = v;
         return absl::OkStatus();
       }},
      {"--output-shared-memory-size", integer("--output-shared-memory-size", 1, &o.output_shm_size)},
      {"-f", text(&o.csv_file)},
      {"--report", text(&o.report_file)},
  };
  with_value["--protocol"] = with_value["-i"];
  with_value["-s"] = with_value["--stability-percentage"];
  // perf_analyzer's flags that change nothing here, accepted so its command lines run as they
  // are: each closed-loop step keeps N requests in flight, from N threads, whether perf_analyzer
  // would send them synchronously or not; the CSV always has the --verbose-csv columns.
  bool sync = false, async = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      continue;
    }
    if (arg == "--http-json") {
      o.http_json = true;
      continue;
    }
    if (arg == "--sync" || arg == "--async" || arg == "-a" || arg == "--verbose-csv") {
      sync |= arg == "--sync";
      async |= arg == "--async" || arg == "-a";
      continue;
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto it = with_value.find(arg);
    if (it == with_value.end()) return Bad("unknown option '" + arg + "'; see --help");
    if (!has_value) {
      if (i + 1 >= args.size()) return Bad(arg + " needs a value");
      value = args[++i];
    }
    if (absl::Status st = it->second(value); !st.ok()) return st;
  }
  if (o.help) return o;
  if (sync && async) return Bad("--sync and --async are exclusive");
  if (o.model.empty()) return Bad("-m <model> is required; see --help");
  if (o.concurrency && o.request_rate) {
    return Bad("--concurrency-range and --request-rate-range are exclusive");
  }
  if (!o.concurrency && !o.request_rate) o.concurrency = Range{};
  if (o.url.empty()) o.url = o.protocol == "grpc" ? "localhost:8001" : "localhost:8000";
  if (o.http_json && o.protocol != "http") return Bad("--http-json needs -i http");
  if (o.shared_memory != "none" && o.protocol != "http") return Bad("--shared-memory needs -i http");
  if (o.shared_memory != "none" && o.http_json) return Bad("--shared-memory and --http-json are exclusive");
  return o;
}

size_t DatatypeSize(std::string_view t) {
  if (t == "BOOL" || t == "UINT8" || t == "INT8") return 1;
  if (t == "UINT16" || t == "INT16" || t == "FP16" || t == "BF16") return 2;
  if (t == "UINT32" || t == "INT32" || t == "FP32") return 4;
  if (t == "UINT64" || t == "INT64" || t == "FP64") return 8;
  return 0;
}

int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= std::max<int64_t>(d, 0);
  return n;
}

std::string MakeTensorBytes(const TensorSpec& spec, std::string_view mode, uint32_t seed) {
  const int64_t n = ElementCount(spec.shape);
  std::mt19937 rng(seed);
  std::string out;
  if (spec.datatype == "BYTES") {
    // As perf_analyzer's random strings: its default --string-length, 128 characters.
    static constexpr std::string_view kChars =
        "abcdefghijklmnopqrstuvwxyz1234567890-_ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for (int64_t i = 0; i < n; ++i) {
      std::string s;
      if (mode != "zero") {
        s.resize(128);
        for (char& c : s) c = kChars[rng() % kChars.size()];
      }
      uint32_t len = static_cast<uint32_t>(s.size());
      out.append(reinterpret_cast<const char*>(&len), 4);
      out += s;
    }
    return out;
  }
  const size_t size = DatatypeSize(spec.datatype);
  out.assign(static_cast<size_t>(n) * size, '\0');
  if (mode == "zero") return out;
  // perf_analyzer's convention (DataLoader::GenerateData): every byte random, whatever the
  // type, so FP32 spans the whole range (NaN, infinities and denormals included), which is what
  // a model computes on under perf_analyzer. One difference: BOOL is 0 or 1, not any byte.
  for (int64_t i = 0; i < n; ++i) {
    char* p = out.data() + i * size;
    if (spec.datatype == "BOOL") {
      p[0] = static_cast<char>(rng() & 1);
    } else {
      for (size_t b = 0; b < size; ++b) p[b] = static_cast<char>(rng() & 0xff);
    }
  }
  return out;
}

namespace {

// Appends one JSON value as `datatype` to `out` (little-endian).
absl::Status AppendValue(const rapidjson::Value& v, const std::string& type, const std::string& name,
                         std::string* out) {
  auto put = [out](auto x) { out->append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  if (type == "BYTES") {
    if (!v.IsString()) return Bad("input '" + name + "': BYTES data must be strings");
    uint32_t len = v.GetStringLength();
    out->append(reinterpret_cast<const char*>(&len), 4);
    out->append(v.GetString(), len);
    return absl::OkStatus();
  }
  if (type == "BOOL") {
    if (!v.IsBool()) return Bad("input '" + name + "': BOOL data must be true or false");
    put(static_cast<uint8_t>(v.GetBool()));
    return absl::OkStatus();
  }
  if (!v.IsNumber()) return Bad("input '" + name + "': data must be numbers for " + type);
  const double d = v.GetDouble();
  if (type == "FP32") put(static_cast<float>(d));
  else if (type == "FP64") put(d);
  else if (type == "INT8") put(static_cast<int8_t>(v.GetInt64()));
  else if (type == "INT16") put(static_cast<int16_t>(v.GetInt64()));
  else if (type == "INT32") put(static_cast<int32_t>(v.GetInt64()));
  else if (type == "INT64") put(static_cast<int64_t>(v.GetInt64()));
  else if (type == "UINT8") put(static_cast<uint8_t>(v.GetUint64()));
  else if (type == "UINT16") put(static_cast<uint16_t>(v.GetUint64()));
  else if (type == "UINT32") put(static_cast<uint32_t>(v.GetUint64()));
  else if (type == "UINT64") put(static_cast<uint64_t>(v.GetUint64()));
  else return Bad("input '" + name + "': --input-data cannot give " + type + " values");
  return absl::OkStatus();
}

void Flatten(const rapidjson::Value& v, std::vector<const rapidjson::Value*>* out) {
  if (v.IsArray()) {
    for (const auto& e : v.GetArray()) Flatten(e, out);
  } else {
    out->push_back(&v);
  }
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseInputDataJson(
    std::string_view json, std::vector<TensorSpec>* specs) {
  rapidjson::Document doc;
  doc.Parse(json.data(), json.size());
  if (doc.HasParseError()) {
    return Bad(std::string("--input-data: malformed JSON at offset ") +
               std::to_string(doc.GetErrorOffset()) + ": " + rapidjson::GetParseError_En(doc.GetParseError()));
  }
  if (!doc.IsObject() || !doc.HasMember("data") || !doc["data"].IsArray() || doc["data"].Empty() ||
      !doc["data"][0].IsObject()) {
    return Bad("--input-data: expected {\"data\": [{\"<input>\": [...]}, ...]}");
  }
  const auto& entry = doc["data"][0];
  std::map<std::string, std::string> out;
  for (auto& spec : *specs) {
    if (!entry.HasMember(spec.name.c_str())) {
      return Bad("--input-data: no data for input '" + spec.name + "'");
    }
    const auto& v = entry[spec.name.c_str()];
    const rapidjson::Value* content = &v;
    if (v.IsObject()) {
      if (!v.HasMember("content")) return Bad("--input-data: input '" + spec.name + "' has no 'content'");
      content = &v["content"];
      if (v.HasMember("shape") && v["shape"].IsArray()) {
        std::vector<int64_t> shape;
        for (const auto& d : v["shape"].GetArray()) {
          if (!d.IsInt64() || d.GetInt64() < 0) return Bad("--input-data: input '" + spec.name + "' has a bad shape");
          shape.push_back(d.GetInt64());
        }
        // The file's shape excludes the batch dimension, as --shape does.
        const bool batched = spec.shape.size() == shape.size() + 1;
        std::vector<int64_t> full = shape;
        if (batched) full.insert(full.begin(), spec.shape[0]);
        spec.shape = full;
      }
    }
    if (std::any_of(spec.shape.begin(), spec.shape.end(), [](int64_t d) { return d < 0; })) {
      return Bad("--input-data: input '" + spec.name + "' has a variable dimension; give its "
                 "\"shape\" in the file or --shape " + spec.name + ":d1,d2,...");
    }
    std::vector<const rapidjson::Value*> values;
    Flatten(*content, &values);
    std::string raw;
    for (const auto* e : values) {
      if (absl::Status st = AppendValue(*e, spec.datatype, spec.name, &raw); !st.ok()) return st;
    }
    // One item of data repeated over the batch when the file holds one batch item.
    const int64_t want = ElementCount(spec.shape);
    const int64_t have = static_cast<int64_t>(values.size());
    if (have == 0 || want % have != 0) {
      return Bad("--input-data: input '" + spec.name + "' has " + std::to_string(have) +
                 " values; its shape needs " + std::to_string(want));
    }
    std::string full;
    for (int64_t k = 0; k < want / have; ++k) full += raw;
    out[spec.name] = std::move(full);
  }
  return out;
}

absl::StatusOr<std::string> JsonDataArray(const TensorSpec& spec, std::string_view raw) {
  std::string out = "[";
  auto sep = [&](bool first) { if (!first) out += ','; };
  const std::string& t = spec.datatype;
  if (t == "BYTES") {
    size_t pos = 0;
    bool first = true;
    while (pos + 4 <= raw.size()) {
      uint32_t len;
      std::memcpy(&len, raw.data() + pos, 4);
      pos += 4;
      if (pos + len > raw.size()) return Bad("input '" + spec.name + "': truncated BYTES element");
      sep(first);
      first = false;
      out += '"';
      for (char c : raw.substr(pos, len)) {
        if (c == '"' || c == '\\') out += '\\';
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
      }
      out += '"';
      pos += len;
    }
    return out + "]";
  }
  const size_t size = DatatypeSize(t);
  if (size == 0 || t == "FP16" || t == "BF16") {
    return Bad("input '" + spec.name + "': " + t + " cannot be sent as JSON; use the binary extension");
  }
  for (size_t i = 0; i * size < raw.size(); ++i) {
    sep(i == 0);
    const char* p = raw.data() + i * size;
    char buf[64];
    // Random data spans every float (perf_analyzer's convention): NaN and the infinities as
    // the KServe JSON readers of Triton and inferd take them.
    auto real = [&buf](double d, const char* format) {
      if (std::isnan(d)) std::snprintf(buf, sizeof(buf), "NaN");
      else if (std::isinf(d)) std::snprintf(buf, sizeof(buf), d > 0 ? "Infinity" : "-Infinity");
      else std::snprintf(buf, sizeof(buf), format, d);
    };
    if (t == "FP32") { float f; std::memcpy(&f, p, 4); real(f, "%.9g"); }
    else if (t == "FP64") { double d; std::memcpy(&d, p, 8); real(d, "%.17g"); }
    else if (t == "BOOL") { std::snprintf(buf, sizeof(buf), "%s", p[0] ? "true" : "false"); }
    else if (t == "INT8") { int8_t v; std::memcpy(&v, p, 1); std::snprintf(buf, sizeof(buf), "%d", v); }
    else if (t == "INT16") { int16_t v; std::memcpy(&v, p, 2); std::snprintf(buf, sizeof(buf), "%d", v); }
    else if (t == "INT32") { int32_t v; std::memcpy(&v, p, 4); std::snprintf(buf, sizeof(buf), "%d", v); }
    else if (t == "INT64") { int64_t v; std::memcpy(&v, p, 8); std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v)); }
    else if (t == "UINT8") { uint8_t v; std::memcpy(&v, p, 1); std::snprintf(buf, sizeof(buf), "%u", v); }
    else if (t == "UINT16") { uint16_t v; std::memcpy(&v, p, 2); std::snprintf(buf, sizeof(buf), "%u", v); }
    else if (t == "UINT32") { uint32_t v; std::memcpy(&v, p, 4); std::snprintf(buf, sizeof(buf), "%u", v); }
    else { uint64_t v; std::memcpy(&v, p, 8); std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(v)); }
    out += buf;
  }
  return out + "]";
}

double Percentile(const std::vector<uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank: the smallest value with at least p % of the samples at or below it.
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return static_cast<double>(sorted[rank - 1]);
}

bool IsStable(const std::vector<WindowFigures>& windows, double percentage) {
  if (windows.size() < 3) return false;
  // perf_analyzer's InferenceProfiler::DetermineStability: no window without throughput, and
  // for throughput and latency each, max / min of the last three windows <= 1 + p.
  auto within = [&](auto get) {
    double lo = get(windows[windows.size() - 3]), hi = lo;
    for (size_t i = windows.size() - 3; i < windows.size(); ++i) {
      lo = std::min(lo, get(windows[i]));
      hi = std::max(hi, get(windows[i]));
    }
    if (lo <= 0) return false;
    return hi / lo <= 1 + percentage / 100.0;
  };
  return within([](const WindowFigures& w) { return w.throughput; }) &&
         within([](const WindowFigures& w) { return w.latency_us; });
}

std::string CsvHeader(bool request_rate_mode) {
  return std::string(request_rate_mode ? "Request Rate" : "Concurrency") +
         ",Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
         "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
         "p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,"
         "response wait,Failed";
}

std::string CsvRow(const StepResult& r) {
  const ServerBreakdown& s = r.server;
  const double server = ServerTotal(s);
  const double wait = std::max(0.0, r.avg_us - r.send_us - r.recv_us);
  const double network = std::max(0.0, wait - server);
  auto us = [](double v) { return std::to_string(static_cast<int64_t>(std::llround(v))); };
  std::ostringstream o;
  o << r.level << ',' << Fmt(r.throughput, 2) << ',' << us(r.send_us) << ',' << us(network) << ','
    << us(s.queue_us) << ',' << us(s.compute_input_us) << ',' << us(s.compute_infer_us) << ','
    << us(s.compute_output_us) << ',' << us(r.recv_us) << ',' << us(r.p50_us) << ','
    << us(r.p90_us) << ',' << us(r.p95_us) << ',' << us(r.p99_us) << ',' << us(r.avg_us) << ','
    << us(r.send_us + r.recv_us) << ',' << us(wait) << ',' << r.failed;
  return o.str();
}

std::string HtmlReport(const std::string& title, bool request_rate_mode,
                       const std::vector<StepResult>& steps) {
  // The legend sits right of the plot area (R wide), so it never covers a point or a bar.
  constexpr double W = 760, H = 360, L = 70, R = 140, T = 20, B = 50;
  double max_tp = 1, max_lat = 1, max_bar = 1;
  for (const auto& s : steps) {
    max_tp = std::max(max_tp, s.throughput);
    max_lat = std::max(max_lat, s.p99_us);
    max_bar = std::max({max_bar, s.avg_us, ServerTotal(s.server)});
  }
  auto x = [&](double tp) { return L + (W - L - R) * tp / (max_tp * 1.05); };
  auto y = [&](double v, double max) { return H - B - (H - T - B) * v / (max * 1.05); };
  auto axes = [&](const std::string& xlabel, const std::string& ylabel, double ymax, double xmax) {
    std::string a;
    a += "<text x='" + Fmt(L - 5) + "' y='" + Fmt(H - B + 4) + "' text-anchor='end' font-size='11'>0</text>";
    if (xmax > 0) {
      a += "<text x='" + Fmt(W - R) + "' y='" + Fmt(H - B + 15) + "' text-anchor='end' font-size='11'>" +
           Fmt(xmax * 1.05, 0) + "</text>";
    }
    a += "<line x1='" + Fmt(L) + "' y1='" + Fmt(H - B) + "' x2='" + Fmt(W - R) + "' y2='" + Fmt(H - B) + "' stroke='#333'/>";
    a += "<line x1='" + Fmt(L) + "' y1='" + Fmt(T) + "' x2='" + Fmt(L) + "' y2='" + Fmt(H - B) + "' stroke='#333'/>";
    a += "<text x='" + Fmt((L + W - R) / 2) + "' y='" + Fmt(H - 10) + "' text-anchor='middle'>" + xlabel + "</text>";
    a += "<text x='15' y='" + Fmt((H - B + T) / 2) + "' transform='rotate(-90 15 " + Fmt((H - B + T) / 2) +
         ")' text-anchor='middle'>" + ylabel + "</text>";
    a += "<text x='" + Fmt(L - 5) + "' y='" + Fmt(T + 5) + "' text-anchor='end' font-size='11'>" + Fmt(ymax * 1.05, 0) + "</text>";
    return a;
  };
  std::string html = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + HtmlEscape(title) +
                     "</title><style>body{font-family:sans-serif;margin:20px}table{border-collapse:collapse}"
                     "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>";
  html += "<h1>" + HtmlEscape(title) + "</h1>";
  // Latency percentiles against throughput.
  html += "<h2>Latency against throughput</h2><svg id='latency-plot' width='" + Fmt(W, 0) + "' height='" +
          Fmt(H, 0) + "' xmlns='http://www.w3.org/2000/svg'>";
  html += axes("throughput (infer/s)", "latency (us)", max_lat, max_tp);
  const struct { const char* name; const char* color; double StepResult::*field; } series[] = {
      {"p50", "#1f77b4", &StepResult::p50_us}, {"p90", "#ff7f0e", &StepResult::p90_us},
      {"p99", "#d62728", &StepResult::p99_us}};
  int legend = 0;
  for (const auto& sr : series) {
    std::string points;
    for (const auto& s : steps) points += Fmt(x(s.throughput)) + "," + Fmt(y(s.*sr.field, max_lat)) + " ";
    html += "<polyline class='" + std::string(sr.name) + "' fill='none' stroke='" + sr.color + "' points='" + points + "'/>";
    for (const auto& s : steps) {
      html += "<circle cx='" + Fmt(x(s.throughput)) + "' cy='" + Fmt(y(s.*sr.field, max_lat)) + "' r='3' fill='" +
              sr.color + "'><title>" + sr.name + " " + Fmt(s.*sr.field, 0) + " us at " + Fmt(s.throughput) +
              " infer/s</title></circle>";
    }
    html += "<text x='" + Fmt(W - R + 15) + "' y='" + Fmt(T + 15 + 15 * legend++) + "' font-size='12' fill='" + sr.color + "'>" + sr.name + "</text>";
  }
  html += "</svg>";
  // Server-side breakdown, one stacked bar per step.
  html += "<h2>Where the average request's time goes</h2><svg id='breakdown-plot' width='" + Fmt(W, 0) + "' height='" +
          Fmt(H, 0) + "' xmlns='http://www.w3.org/2000/svg'>";
  html += axes(request_rate_mode ? "request rate (req/s)" : "concurrency", "us per request (average)", max_bar, 0);
  const double slot = (W - L - R) / std::max<size_t>(1, steps.size());
  const struct { const char* name; const char* color; double (*value)(const StepResult&); } parts[] = {
      {"queue", "#9467bd", [](const StepResult& s) { return s.server.queue_us; }},
      {"compute input", "#2ca02c", [](const StepResult& s) { return s.server.compute_input_us; }},
      {"compute infer", "#1f77b4", [](const StepResult& s) { return s.server.compute_infer_us; }},
      {"compute output", "#ff7f0e", [](const StepResult& s) { return s.server.compute_output_us; }},
      // The client's average latency beyond the server's parts: network, protocol handling
      // in the server's frontend and in this client.
      {"rest", "#aaaaaa", [](const StepResult& s) { return std::max(0.0, s.avg_us - ServerTotal(s.server)); }}};
  constexpr size_t kParts = sizeof(parts) / sizeof(parts[0]);
  for (size_t i = 0; i < steps.size(); ++i) {
    double base = 0;
    const double bx = L + slot * i + slot * 0.2;
    for (const auto& p : parts) {
      const double v = p.value(steps[i]);
      const double top = y(base + v, max_bar), bottom = y(base, max_bar);
      html += "<rect class='" + std::string(p.name) + "' x='" + Fmt(bx) + "' y='" + Fmt(top) + "' width='" +
              Fmt(slot * 0.6) + "' height='" + Fmt(std::max(0.0, bottom - top)) + "' fill='" + p.color +
              "'><title>" + p.name + " " + Fmt(v) + " us</title></rect>";
      base += v;
    }
    html += "<text x='" + Fmt(bx + slot * 0.3) + "' y='" + Fmt(H - B + 15) + "' text-anchor='middle' font-size='11'>" +
            std::to_string(steps[i].level) + "</text>";
  }
  for (size_t k = 0; k < kParts; ++k) {
    html += "<text x='" + Fmt(W - R + 15) + "' y='" + Fmt(T + 15 + 15 * k) + "' font-size='12' fill='" + parts[k].color + "'>" +
            parts[k].name + "</text>";
  }
  html += "</svg><h2>Numbers</h2><table><tr>";
  std::istringstream header(CsvHeader(request_rate_mode));
  for (std::string col; std::getline(header, col, ',');) html += "<th>" + HtmlEscape(col) + "</th>";
  html += "</tr>";
  for (const auto& s : steps) {
    html += "<tr>";
    std::istringstream row(CsvRow(s));
    for (std::string cell; std::getline(row, cell, ',');) html += "<td>" + cell + "</td>";
    html += "</tr>";
  }
  html += "</table><p>Times in microseconds. Server-side figures come from the statistics "
          "extension over each step's measurement windows; 'rest' is the client's average latency "
          "beyond them (network, protocol handling, client).</p></body></html>\n";
  return html;
}

}  // namespace inferd::perf
