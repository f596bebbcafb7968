// inferd-perf's testable parts: command-line parsing in perf_analyzer's spirit, request data,
// latency statistics and the stability rule, the CSV and the HTML report. The measuring loops
// and the protocol clients are in inferd_perf.cc and http_client.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::perf {

// Monotonic clock in nanoseconds.
uint64_t NowNs();

struct Range {
  int64_t start = 1;
  int64_t end = 1;
  int64_t step = 1;
  std::vector<int64_t> Values() const;
};

// "a", "a:b" or "a:b:c" with 1 <= a <= b and c >= 1. Errors name `flag`.
absl::StatusOr<Range> ParseRange(std::string_view text, std::string_view flag);

// "name:d1,d2,..." (dims >= 1; the batch dimension excluded, as perf_analyzer's --shape).
absl::StatusOr<std::pair<std::string, std::vector<int64_t>>> ParseShape(std::string_view text);

struct Options {
  std::string model;
  std::string version;
  std::string url;  // host:port
  std::string protocol = "http";
  bool http_json = false;
  // perf_analyzer's --shared-memory: "none", or "system" (HTTP only): inputs and outputs go
  // through POSIX shared-memory regions registered with the server (one input region and one
  // output region, shared by every worker, as perf_analyzer does).
  std::string shared_memory = "none";
  int64_t output_shm_size = 102400;  // --output-shared-memory-size, bytes per output
  int64_t batch = 1;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string input_data = "random";  // zero | random | <json file>
  std::optional<Range> concurrency;   // closed loop (the default, 1:1:1)
  std::optional<Range> request_rate;  // open loop
  std::string distribution = "constant";
  int64_t measurement_interval_ms = 5000;
  double stability_percentage = 10;
  int64_t max_trials = 10;
  int64_t percentile = 0;  // 0: stability and the reported latency use the average
  int64_t warmup_requests = 0;
  int64_t max_threads = 16;  // open loop workers
  std::string csv_file;
  std::string report_file;
  bool help = false;
};

// Accepts "--name=value", "--name value" and "-m value". Errors name the option.
absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args);
std::string Usage();

// One tensor of a request.
struct TensorSpec {
  std::string name;
  std::string datatype;        // KServe name: FP32, INT64, BYTES, ...
  std::vector<int64_t> shape;  // full shape, batch dimension included when the model batches
};

// Element size in bytes; 0 for BYTES and unknown types.
size_t DatatypeSize(std::string_view datatype);
int64_t ElementCount(const std::vector<int64_t>& shape);

// Raw little-endian bytes for `spec` ("zero" or "random"; BYTES elements are 4-byte length +
// bytes). "random" is perf_analyzer's: random bytes for every fixed-size type (BOOL: 0 or 1),
// strings of 128 random characters for BYTES.
std::string MakeTensorBytes(const TensorSpec& spec, std::string_view mode, uint32_t seed);

// perf_analyzer's --input-data JSON: {"data": [{"INPUT0": [..] or {"content": [..], "shape":
// [..]}}, ...]}; the first entry is used. Returns raw bytes per input and sets shapes given
// there into `specs`. Errors name the input and what is wrong.
absl::StatusOr<std::map<std::string, std::string>> ParseInputDataJson(
    std::string_view json, std::vector<TensorSpec>* specs);

// The KServe v2 JSON "data" array for raw tensor bytes.
absl::StatusOr<std::string> JsonDataArray(const TensorSpec& spec, std::string_view raw);

// Server-side averages per request from the statistics extension over one window (us).
struct ServerBreakdown {
  uint64_t requests = 0;
  double queue_us = 0, compute_input_us = 0, compute_infer_us = 0, compute_output_us = 0;
  double total_us = 0;  // request duration as the server saw it
};

// What one measured step reports.
struct StepResult {
  int64_t level = 0;  // concurrency, or requests/s in open-loop mode
  double throughput = 0;  // inferences/s (requests x batch)
  double request_rate = 0;  // requests completed per second, failed ones included (open loop: the achieved rate)
  uint64_t requests = 0;  // succeeded inside the reported (last three) windows
  uint64_t failed = 0;    // failed at any time during the step, every window included
  double avg_us = 0, p50_us = 0, p90_us = 0, p95_us = 0, p99_us = 0;
  double latency_us = 0;  // the reported latency: the average, or --percentile's value
  double send_us = 0, recv_us = 0;
  ServerBreakdown server;
  bool stable = true;
  int trials = 0;
};

// The value at percentile `p` (0-100) of ascending `sorted` (nearest rank); 0 when empty.
double Percentile(const std::vector<uint64_t>& sorted, double p);

// Per-window figures the stability rule looks at.
struct WindowFigures {
  double throughput = 0;
  double latency_us = 0;  // average, or the chosen percentile
};
// True when, over the last three windows, throughput and latency each have max / min within
// 1 + `percentage` / 100 and no window is without throughput (perf_analyzer's rule).
bool IsStable(const std::vector<WindowFigures>& windows, double percentage);

std::string CsvHeader(bool request_rate_mode);
std::string CsvRow(const StepResult& r);

// A self-contained HTML page: latency percentiles against throughput (svg#latency-plot) and
// the average request's time as stacked bars (svg#breakdown-plot: the server's queue, compute
// input, compute infer, compute output, then the rest of the client's average latency:
// network, HTTP/gRPC handling, client), with the numbers as a table.
std::string HtmlReport(const std::string& title, bool request_rate_mode,
                       const std::vector<StepResult>& steps);

}  // namespace inferd::perf
