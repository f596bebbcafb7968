// inferd-perf: measures a KServe v2 server (inferd, Triton, ...) the way perf_analyzer does:
// closed loop over a concurrency range or open loop over a request-rate range, measurement
// windows repeated until stable, client and server-side latency breakdowns, CSV and an HTML
// report. See --help and README.md.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "grpc_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rapidjson/document.h"
#include "tools/perf/http_client.h"
#include "tools/perf/perf_lib.h"

namespace inferd::perf {
namespace {

// A request that takes longer than this counts as failed instead of hanging the run.
constexpr int kRequestTimeoutSeconds = 60;

std::string Fmt1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

struct Outcome {
  bool ok = false;
  uint64_t send_ns = 0, recv_ns = 0;
  std::string error;
};

// Cumulative server counters from the statistics extension.
struct Counters {
  uint64_t success = 0, success_ns = 0, queue_ns = 0, input_ns = 0, infer_ns = 0, output_ns = 0;
};

class Worker {
 public:
  virtual ~Worker() = default;
  virtual Outcome Send() = 0;
};

class Protocol {
 public:
  virtual ~Protocol() = default;
  // Reads the model's inputs, outputs and max_batch_size.
  virtual absl::Status Describe(std::vector<TensorSpec>* inputs, std::vector<std::string>* outputs,
                                int64_t* max_batch_size) = 0;
  virtual absl::Status Prepare(const std::vector<TensorSpec>& inputs,
                               const std::map<std::string, std::string>& data,
                               const std::vector<std::string>& outputs) = 0;
  virtual std::unique_ptr<Worker> NewWorker() = 0;
  virtual absl::StatusOr<Counters> Stats() = 0;
};

bool IsArray(const rapidjson::Value& v, const char* key) {
  return v.IsObject() && v.HasMember(key) && v[key].IsArray();
}
bool IsString(const rapidjson::Value& v, const char* key) {
  return v.IsObject() && v.HasMember(key) && v[key].IsString();
}

std::string JsonError(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (!d.HasParseError() && d.IsObject() && d.HasMember("error") && d["error"].IsString()) {
    return d["error"].GetString();
  }
  return body.substr(0, 200);
}

// ---- HTTP -----------------------------------------------------------------------------------

class HttpProtocol : public Protocol {
 public:
  HttpProtocol(const Options& o, std::string host, int port)
      : options_(o), host_(std::move(host)), port_(port) {
    base_ = "/v2/models/" + o.model + (o.version.empty() ? "" : "/versions/" + o.version);
  }

  absl::Status Describe(std::vector<TensorSpec>* inputs, std::vector<std::string>* outputs,
                        int64_t* max_batch_size) override {
    HttpClient c(host_, port_);
    auto md = Get(c, base_);
    if (!md.ok()) return md.status();
    // Checked member by member: a server that answers something else gets a message, not a
    // rapidjson assertion.
    const rapidjson::Document& meta = **md;
    const auto bad = absl::DataLossError("GET " + base_ + ": not KServe v2 model metadata "
                                         "(inputs/outputs with name, datatype, shape)");
    if (!IsArray(meta, "inputs") || !IsArray(meta, "outputs")) return bad;
    for (const auto& in : meta["inputs"].GetArray()) {
      if (!IsString(in, "name") || !IsString(in, "datatype") || !IsArray(in, "shape")) return bad;
      TensorSpec s{in["name"].GetString(), in["datatype"].GetString(), {}};
      for (const auto& d : in["shape"].GetArray()) {
        if (!d.IsInt64()) return bad;
        s.shape.push_back(d.GetInt64());
      }
      inputs->push_back(s);
    }
    for (const auto& out : meta["outputs"].GetArray()) {
      if (!IsString(out, "name")) return bad;
      outputs->push_back(out["name"].GetString());
    }
    auto cfg = Get(c, base_ + "/config");
    if (!cfg.ok()) return cfg.status();
    const rapidjson::Document& config = **cfg;
    *max_batch_size = config.HasMember("max_batch_size") && config["max_batch_size"].IsInt64()
                          ? config["max_batch_size"].GetInt64()
                          : 0;
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::vector<TensorSpec>& inputs,
                       const std::map<std::string, std::string>& data,
                       const std::vector<std::string>& outputs) override {
    if (options_.shared_memory == "system") return PrepareSharedMemory(inputs, data, outputs);
    std::string header = "{\"inputs\":[";
    std::string raw;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& s = inputs[i];
      if (i) header += ',';
      header += "{\"name\":\"" + s.name + "\",\"datatype\":\"" + s.datatype + "\",\"shape\":[";
      // Appends, not `"," + std::string`: GCC 12 reports a false -Wrestrict on the latter.
      for (size_t k = 0; k < s.shape.size(); ++k) {
        if (k) header += ',';
        header += std::to_string(s.shape[k]);
      }
      header += "]";
      const std::string& bytes = data.at(s.name);
      if (options_.http_json) {
        auto arr = JsonDataArray(s, bytes);
        if (!arr.ok()) return arr.status();
        header += ",\"data\":" + *arr + "}";
      } else {
        header += ",\"parameters\":{\"binary_data_size\":" + std::to_string(bytes.size()) + "}}";
        raw += bytes;
      }
    }
    header += "],\"outputs\":[";
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (i) header += ',';
      header += "{\"name\":\"";
      header += outputs[i];
      header += options_.http_json ? "\"}" : "\",\"parameters\":{\"binary_data\":true}}";
    }
    header += "]}";
    body_ = header + raw;
    headers_.clear();
    if (options_.http_json) {
      headers_.push_back("Content-Type: application/json");
    } else {
      headers_.push_back("Content-Type: application/octet-stream");
      headers_.push_back("Inference-Header-Content-Length: " + std::to_string(header.size()));
    }
    return absl::OkStatus();
  }

  ~HttpProtocol() override {
    if (shm_names_.empty()) return;
    HttpClient c(host_, port_);
    for (const auto& [region, key] : shm_names_) {
      (void)c.Request("POST", "/v2/systemsharedmemory/region/" + region + "/unregister", {}, "");
      shm_unlink(key.c_str());
    }
  }

  // Input bytes in one region, each output in its own slice of a second region; the body is
  // only the JSON header naming them.
  absl::Status PrepareSharedMemory(const std::vector<TensorSpec>& inputs,
                                   const std::map<std::string, std::string>& data,
                                   const std::vector<std::string>& outputs) {
    const std::string tag = std::to_string(getpid());
    auto make = [&](const std::string& region, size_t size,
                    const std::string& contents) -> absl::Status {
      const std::string key = "/inferd_perf_" + tag + "_" + region;
      const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
      if (fd < 0) return absl::InternalError("shm_open " + key + " failed");
      shm_names_.emplace_back(region, key);
      if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        close(fd);
        return absl::InternalError("ftruncate " + key + " failed");
      }
      if (!contents.empty()) {
        void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
          close(fd);
          return absl::InternalError("mmap " + key + " failed");
        }
        std::memcpy(m, contents.data(), contents.size());
        munmap(m, size);
      }
      close(fd);
      HttpClient c(host_, port_);
      auto r = c.Request("POST", "/v2/systemsharedmemory/region/" + region + "/register",
                         {"Content-Type: application/json"},
                         "{\"key\":\"" + key + "\",\"offset\":0,\"byte_size\":" +
                             std::to_string(size) + "}");
      if (!r.ok()) return r.status();
      if (r->status != 200) {
        return absl::FailedPreconditionError("registering shared memory region '" + region +
                                             "': HTTP " + std::to_string(r->status) + ": " +
                                             JsonError(r->body));
      }
      return absl::OkStatus();
    };
    const std::string in_region = "perf_in_" + tag, out_region = "perf_out_" + tag;
    std::string all;
    std::string header = "{\"inputs\":[";
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& s = inputs[i];
      const std::string& bytes = data.at(s.name);
      if (i) header += ',';
      header += "{\"name\":\"" + s.name + "\",\"datatype\":\"" + s.datatype + "\",\"shape\":[";
      for (size_t k = 0; k < s.shape.size(); ++k) {
        if (k) header += ',';
        header += std::to_string(s.shape[k]);
      }
      header += "],\"parameters\":{\"shared_memory_region\":\"" + in_region +
                "\",\"shared_memory_offset\":" + std::to_string(all.size()) +
                ",\"shared_memory_byte_size\":" + std::to_string(bytes.size()) + "}}";
      all += bytes;
    }
    header += "],\"outputs\":[";
    const size_t out_size = static_cast<size_t>(options_.output_shm_size);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (i) header += ',';
      header += "{\"name\":\"" + outputs[i] + "\",\"parameters\":{\"shared_memory_region\":\"" +
                out_region + "\",\"shared_memory_offset\":" + std::to_string(i * out_size) +
                ",\"shared_memory_byte_size\":" + std::to_string(out_size) + "}}";
    }
    header += "]}";
    if (auto st = make(in_region, std::max<size_t>(all.size(), 1), all); !st.ok()) return st;
    if (auto st = make(out_region, std::max<size_t>(outputs.size(), 1) * out_size, ""); !st.ok()) {
      return st;
    }
    body_ = header;
    headers_ = {"Content-Type: application/json"};
    return absl::OkStatus();
  }

  std::unique_ptr<Worker> NewWorker() override {
    struct W : Worker {
      W(const HttpProtocol* p) : p(p), client(p->host_, p->port_) {}
      Outcome Send() override {
        Outcome o;
        auto r = client.Request("POST", p->base_ + "/infer", p->headers_, p->body_);
        if (!r.ok()) {
          o.error = std::string(r.status().message());
          return o;
        }
        o.send_ns = r->send_ns;
        o.recv_ns = r->recv_ns;
        o.ok = r->status == 200;
        if (!o.ok) o.error = "HTTP " + std::to_string(r->status) + ": " + JsonError(r->body);
        return o;
      }
      const HttpProtocol* p;
      HttpClient client;
    };
    return std::make_unique<W>(this);
  }

  absl::StatusOr<Counters> Stats() override {
    if (!stats_client_) stats_client_ = std::make_unique<HttpClient>(host_, port_);
    auto doc = Get(*stats_client_, base_ + "/stats");
    if (!doc.ok()) return doc.status();
    Counters c;
    if (!IsArray(**doc, "model_stats")) {
      return absl::DataLossError("GET " + base_ + "/stats: no model_stats array");
    }
    for (const auto& m : (**doc)["model_stats"].GetArray()) {
      if (!m.IsObject() || !m.HasMember("inference_stats") || !m["inference_stats"].IsObject()) continue;
      const auto& s = m["inference_stats"];
      // Counters are numbers, or strings holding numbers (proto3 JSON's 64-bit integers).
      auto get = [&](const char* k, const char* f) -> uint64_t {
        if (!s.HasMember(k) || !s[k].IsObject() || !s[k].HasMember(f)) return 0;
        const auto& v = s[k][f];
        if (v.IsUint64()) return v.GetUint64();
        return v.IsString() ? static_cast<uint64_t>(std::strtoull(v.GetString(), nullptr, 10)) : 0;
      };
      c.success += get("success", "count");
      c.success_ns += get("success", "ns");
      c.queue_ns += get("queue", "ns");
      c.input_ns += get("compute_input", "ns");
      c.infer_ns += get("compute_infer", "ns");
      c.output_ns += get("compute_output", "ns");
    }
    return c;
  }

 private:
  absl::StatusOr<std::shared_ptr<rapidjson::Document>> Get(HttpClient& c, const std::string& path) {
    auto r = c.Request("GET", path, {}, "");
    if (!r.ok()) return r.status();
    if (r->status != 200) {
      return absl::NotFoundError("model '" + options_.model + "': GET " + path + " answered " +
                                 std::to_string(r->status) + ": " + JsonError(r->body));
    }
    auto d = std::make_shared<rapidjson::Document>();
    d->Parse(r->body.data(), r->body.size());
    if (d->HasParseError() || !d->IsObject()) {
      return absl::DataLossError("GET " + path + ": the answer is not a JSON object");
    }
    return d;
  }

  const Options& options_;
  std::string host_;
  int port_;
  std::string base_;
  std::string body_;
  std::vector<std::string> headers_;
  std::unique_ptr<HttpClient> stats_client_;
  std::vector<std::pair<std::string, std::string>> shm_names_;  // region name, shm key
};

// ---- gRPC -----------------------------------------------------------------------------------

class GrpcProtocol : public Protocol {
 public:
  explicit GrpcProtocol(const Options& o) : options_(o), stub_(NewStub(o.url, 0)) {}

  // Each worker gets its own channel and so its own HTTP/2 connection, as each HTTP worker
  // has its own socket: gRPC would otherwise share one subchannel between equal channels.
  static std::unique_ptr<inference::GRPCInferenceService::Stub> NewStub(const std::string& url,
                                                                       int id) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("inferd_perf.worker", id);
    return inference::GRPCInferenceService::NewStub(
        grpc::CreateCustomChannel(url, grpc::InsecureChannelCredentials(), args));
  }

  absl::Status Describe(std::vector<TensorSpec>* inputs, std::vector<std::string>* outputs,
                        int64_t* max_batch_size) override {
    inference::ModelMetadataRequest req;
    req.set_name(options_.model);
    req.set_version(options_.version);
    inference::ModelMetadataResponse md;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status st = stub_->ModelMetadata(&ctx, req, &md);
    if (!st.ok()) {
      return absl::NotFoundError("model '" + options_.model + "': ModelMetadata failed: " + st.error_message());
    }
    for (const auto& in : md.inputs()) {
      inputs->push_back({in.name(), in.datatype(), {in.shape().begin(), in.shape().end()}});
    }
    for (const auto& out : md.outputs()) outputs->push_back(out.name());
    inference::ModelConfigRequest creq;
    creq.set_name(options_.model);
    creq.set_version(options_.version);
    inference::ModelConfigResponse cfg;
    grpc::ClientContext ctx2;
    ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    st = stub_->ModelConfig(&ctx2, creq, &cfg);
    if (!st.ok()) return absl::NotFoundError("model '" + options_.model + "': ModelConfig failed: " + st.error_message());
    *max_batch_size = cfg.config().max_batch_size();
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::vector<TensorSpec>& inputs,
                       const std::map<std::string, std::string>& data,
                       const std::vector<std::string>& outputs) override {
    request_.set_model_name(options_.model);
    request_.set_model_version(options_.version);
    for (const auto& s : inputs) {
      auto* t = request_.add_inputs();
      t->set_name(s.name);
      t->set_datatype(s.datatype);
      for (int64_t d : s.shape) t->add_shape(d);
      request_.add_raw_input_contents(data.at(s.name));
    }
    for (const auto& o : outputs) request_.add_outputs()->set_name(o);
    return absl::OkStatus();
  }

  std::unique_ptr<Worker> NewWorker() override {
    struct W : Worker {
      W(const GrpcProtocol* p, int id) : p(p), stub(NewStub(p->options_.url, id)) {}
      Outcome Send() override {
        Outcome o;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kRequestTimeoutSeconds));
        inference::ModelInferResponse resp;
        grpc::Status st = stub->ModelInfer(&ctx, p->request_, &resp);
        o.ok = st.ok();
        if (!o.ok) o.error = "gRPC " + std::to_string(st.error_code()) + ": " + st.error_message();
        return o;
      }
      const GrpcProtocol* p;
      std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
    };
    return std::make_unique<W>(this, ++workers_);
  }

  absl::StatusOr<Counters> Stats() override {
    inference::ModelStatisticsRequest req;
    req.set_name(options_.model);
    req.set_version(options_.version);
    inference::ModelStatisticsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status st = stub_->ModelStatistics(&ctx, req, &resp);
    if (!st.ok()) return absl::UnavailableError("ModelStatistics failed: " + st.error_message());
    Counters c;
    for (const auto& m : resp.model_stats()) {
      const auto& s = m.inference_stats();
      c.success += s.success().count();
      c.success_ns += s.success().ns();
      c.queue_ns += s.queue().ns();
      c.input_ns += s.compute_input().ns();
      c.infer_ns += s.compute_infer().ns();
      c.output_ns += s.compute_output().ns();
    }
    return c;
  }

 private:
  const Options& options_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;  // metadata and statistics
  inference::ModelInferRequest request_;
  std::atomic<int> workers_{0};
};

// ---- measuring ------------------------------------------------------------------------------

struct Record {
  uint64_t start = 0, end = 0, send = 0, recv = 0;
  bool ok = false;
};

class Recorder {
 public:
  void Add(const Record& r, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(r);
    if (!r.ok && first_error_.empty()) first_error_ = error;
  }
  std::vector<Record> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Record> out;
    out.swap(records_);
    return out;
  }
  size_t Size() {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.size();
  }
  std::string FirstError() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  std::mutex mu_;
  std::vector<Record> records_;
  std::string first_error_;
};

struct Window {
  double seconds = 0;
  std::vector<Record> records;
  Counters before, after;
  bool have_stats = false;
};

StepResult Summarize(int64_t level, int64_t batch, const std::vector<Window>& windows, int64_t percentile) {
  StepResult r;
  r.level = level;
  double seconds = 0;
  std::vector<uint64_t> lat;
  double send = 0, recv = 0;
  Counters delta;
  bool stats = true;
  for (const auto& w : windows) {
    seconds += w.seconds;
    for (const auto& rec : w.records) {
      if (!rec.ok) {
        ++r.failed;
        continue;
      }
      ++r.requests;
      lat.push_back(rec.end - rec.start);
      send += rec.send;
      recv += rec.recv;
    }
    stats &= w.have_stats;
    if (w.have_stats) {
      delta.success += w.after.success - w.before.success;
      delta.success_ns += w.after.success_ns - w.before.success_ns;
      delta.queue_ns += w.after.queue_ns - w.before.queue_ns;
      delta.input_ns += w.after.input_ns - w.before.input_ns;
      delta.infer_ns += w.after.infer_ns - w.before.infer_ns;
      delta.output_ns += w.after.output_ns - w.before.output_ns;
    }
  }
  std::sort(lat.begin(), lat.end());
  r.throughput = seconds > 0 ? static_cast<double>(r.requests * batch) / seconds : 0;
  r.request_rate = seconds > 0 ? static_cast<double>(r.requests + r.failed) / seconds : 0;
  if (!lat.empty()) {
    double sum = 0;
    for (auto v : lat) sum += v;
    r.avg_us = sum / lat.size() / 1000;
    r.p50_us = Percentile(lat, 50) / 1000;
    r.p90_us = Percentile(lat, 90) / 1000;
    r.p95_us = Percentile(lat, 95) / 1000;
    r.p99_us = Percentile(lat, 99) / 1000;
    r.send_us = send / lat.size() / 1000;
    r.recv_us = recv / lat.size() / 1000;
  }
  if (stats && delta.success > 0) {
    const double n = static_cast<double>(delta.success);
    r.server.requests = delta.success;
    r.server.total_us = delta.success_ns / n / 1000;
    r.server.queue_us = delta.queue_ns / n / 1000;
    r.server.compute_input_us = delta.input_ns / n / 1000;
    r.server.compute_infer_us = delta.infer_ns / n / 1000;
    r.server.compute_output_us = delta.output_ns / n / 1000;
  }
  r.latency_us = percentile > 0 ? Percentile(lat, percentile) / 1000 : r.avg_us;
  return r;
}

// Runs one step (a concurrency, or a request rate) until stable or out of trials.
StepResult RunStep(Protocol& protocol, const Options& o, int64_t level, bool open_loop) {
  Recorder recorder;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const uint64_t origin = NowNs();
  std::mutex schedule_mu;
  uint64_t next_send = origin;
  std::mt19937_64 rng(12345);
  const double gap_ns = 1e9 / static_cast<double>(level);
  std::exponential_distribution<double> exp_gap(1.0 / gap_ns);
  const int64_t nthreads = open_loop ? o.max_threads : level;
  for (int64_t t = 0; t < nthreads; ++t) {
    threads.emplace_back([&] {
      auto worker = protocol.NewWorker();
      while (!stop.load(std::memory_order_relaxed)) {
        uint64_t start = NowNs();
        if (open_loop) {
          {
            std::lock_guard<std::mutex> lock(schedule_mu);
            next_send += static_cast<uint64_t>(o.distribution == "poisson" ? exp_gap(rng) : gap_ns);
            start = next_send;
          }
          // Sleep until the scheduled time; latency counts from it, so a late send shows.
          while (!stop.load(std::memory_order_relaxed)) {
            const uint64_t now = NowNs();
            if (now >= start) break;
            std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<uint64_t>(start - now, 5'000'000)));
          }
          if (stop.load(std::memory_order_relaxed)) break;
        }
        Outcome out = worker->Send();
        recorder.Add({start, NowNs(), out.send_ns, out.recv_ns, out.ok}, out.error);
      }
    });
  }
  std::vector<Window> windows;
  std::vector<WindowFigures> figures;
  bool stable = false;
  const bool tty = isatty(STDERR_FILENO);
  // Failures are counted over the whole step, also outside the reported windows: a failure is
  // never dropped. Latency and throughput come from the last three windows only.
  uint64_t failed_all = 0;
  auto count_failed = [](const std::vector<Record>& records) {
    return static_cast<uint64_t>(
        std::count_if(records.begin(), records.end(), [](const Record& r) { return !r.ok; }));
  };
  failed_all += count_failed(recorder.Take());  // before the first window: not timed
  uint64_t last = NowNs();
  for (int64_t trial = 0; trial < o.max_trials && !stable; ++trial) {
    Window w;
    auto before = protocol.Stats();
    const auto window_end = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(o.measurement_interval_ms);
    if (tty) {
      // The live line: completed requests so far in this window, redrawn four times a second.
      for (auto t = std::chrono::steady_clock::now(); t < window_end; t = std::chrono::steady_clock::now()) {
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            window_end - t, std::chrono::milliseconds(250)));
        const double elapsed = (NowNs() - last) / 1e9;
        std::fprintf(stderr, "\r\033[K%s %lld: window %lld/%lld  %.1f s  %zu requests  ~%.1f infer/s",
                     open_loop ? "request rate" : "concurrency", static_cast<long long>(level),
                     static_cast<long long>(trial + 1), static_cast<long long>(o.max_trials), elapsed,
                     recorder.Size(), elapsed > 0 ? recorder.Size() * o.batch / elapsed : 0.0);
        std::fflush(stderr);
      }
    } else {
      std::this_thread::sleep_until(window_end);
    }
    w.records = recorder.Take();
    const uint64_t now = NowNs();
    auto after = protocol.Stats();
    w.seconds = (now - last) / 1e9;
    last = now;
    if (before.ok() && after.ok()) {
      w.before = *before;
      w.after = *after;
      w.have_stats = true;
    }
    StepResult one = Summarize(level, o.batch, {w}, o.percentile);
    const double latency = one.latency_us;
    failed_all += one.failed;
    figures.push_back({one.throughput, latency});
    windows.push_back(std::move(w));
    stable = IsStable(figures, o.stability_percentage);
    std::fprintf(stderr, "%s%s %lld: window %lld/%lld  %.1f infer/s  latency %.0f us  failed %llu%s%s",
                 tty ? "\r\033[K" : "", open_loop ? "request rate" : "concurrency",
                 static_cast<long long>(level), static_cast<long long>(trial + 1),
                 static_cast<long long>(o.max_trials), one.throughput, latency,
                 static_cast<unsigned long long>(one.failed), stable ? "  stable" : "",
                 tty ? "" : "\n");
    std::fflush(stderr);
  }
  if (tty) std::fprintf(stderr, "\n");
  stop = true;
  for (auto& t : threads) t.join();
  failed_all += count_failed(recorder.Take());  // in flight when the last window closed
  const size_t keep = std::min<size_t>(3, windows.size());
  std::vector<Window> last_windows(std::make_move_iterator(windows.end() - keep),
                                   std::make_move_iterator(windows.end()));
  StepResult r = Summarize(level, o.batch, last_windows, o.percentile);
  r.failed = failed_all;
  r.stable = stable;
  r.trials = static_cast<int>(windows.size());
  if (r.failed > 0) {
    std::fprintf(stderr, "  %llu failed requests; the first: %s\n",
                 static_cast<unsigned long long>(r.failed), recorder.FirstError().c_str());
  }
  return r;
}

int Run(const Options& o) {
  std::unique_ptr<Protocol> protocol;
  if (o.protocol == "grpc") {
    protocol = std::make_unique<GrpcProtocol>(o);
  } else {
    auto hp = SplitHostPort(o.url, 8000);
    if (!hp.ok()) {
      std::cerr << "inferd-perf: " << hp.status().message() << "\n";
      return 2;
    }
    protocol = std::make_unique<HttpProtocol>(o, hp->first, hp->second);
  }
  std::vector<TensorSpec> inputs;
  std::vector<std::string> outputs;
  int64_t max_batch = 0;
  if (absl::Status st = protocol->Describe(&inputs, &outputs, &max_batch); !st.ok()) {
    std::cerr << "inferd-perf: " << st.message() << "\n";
    return 1;
  }
  if (max_batch == 0 && o.batch != 1) {
    std::cerr << "inferd-perf: model '" << o.model << "' does not batch (max_batch_size 0); -b must be 1\n";
    return 2;
  }
  if (max_batch > 0 && o.batch > max_batch) {
    std::cerr << "inferd-perf: -b " << o.batch << " exceeds the model's max_batch_size " << max_batch << "\n";
    return 2;
  }
  for (const auto& shape : o.shapes) {
    const std::string& name = shape.first;
    if (std::none_of(inputs.begin(), inputs.end(), [&](const TensorSpec& s) { return s.name == name; })) {
      std::cerr << "inferd-perf: --shape names input '" << name << "', which model '" << o.model
                << "' does not have\n";
      return 2;
    }
  }
  for (auto& s : inputs) {
    std::vector<int64_t> dims(s.shape.begin() + (max_batch > 0 ? 1 : 0), s.shape.end());
    if (auto it = o.shapes.find(s.name); it != o.shapes.end()) dims = it->second;
    // A data file may give the shape itself; ParseInputDataJson checks what is left.
    const bool shape_from_file = o.input_data != "zero" && o.input_data != "random";
    for (int64_t d : dims) {
      if (d < 0 && !shape_from_file) {
        std::cerr << "inferd-perf: input '" << s.name << "' has a variable dimension; give its shape "
                  << "with --shape " << s.name << ":d1,d2,...\n";
        return 2;
      }
    }
    s.shape = dims;
    if (max_batch > 0) s.shape.insert(s.shape.begin(), o.batch);
  }
  std::map<std::string, std::string> data;
  if (o.input_data == "zero" || o.input_data == "random") {
    uint32_t seed = 1;
    for (const auto& s : inputs) data[s.name] = MakeTensorBytes(s, o.input_data, seed++);
  } else {
    std::ifstream f(o.input_data);
    if (!f) {
      std::cerr << "inferd-perf: --input-data: cannot read '" << o.input_data << "'\n";
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    auto parsed = ParseInputDataJson(ss.str(), &inputs);
    if (!parsed.ok()) {
      std::cerr << "inferd-perf: " << parsed.status().message() << "\n";
      return 2;
    }
    data = *std::move(parsed);
  }
  if (absl::Status st = protocol->Prepare(inputs, data, outputs); !st.ok()) {
    std::cerr << "inferd-perf: " << st.message() << "\n";
    return 2;
  }
  if (o.warmup_requests > 0) {
    auto w = protocol->NewWorker();
    for (int64_t i = 0; i < o.warmup_requests; ++i) w->Send();
  }

  const bool open_loop = o.request_rate.has_value();
  const Range range = open_loop ? *o.request_rate : *o.concurrency;
  const std::string version = o.version.empty() ? "" : " version " + o.version;
  std::string latency_figure = "average";
  if (o.percentile) latency_figure = std::string("p").append(std::to_string(o.percentile));
  std::printf("*** Measurement settings ***\n  model %s%s over %s%s, batch %lld, window %lld ms, "
              "stability %.0f%%, max trials %lld, latency %s\n\n",
              o.model.c_str(), version.c_str(),
              o.protocol.c_str(), o.protocol == "http" ? (o.http_json ? " (JSON)" : " (binary)") : "",
              static_cast<long long>(o.batch), static_cast<long long>(o.measurement_interval_ms),
              o.stability_percentage, static_cast<long long>(o.max_trials),
              latency_figure.c_str());
  std::vector<StepResult> steps;
  uint64_t ok_total = 0, failed_total = 0;
  for (int64_t level : range.Values()) {
    StepResult r = RunStep(*protocol, o, level, open_loop);
    ok_total += r.requests;
    failed_total += r.failed;
    std::printf("%s: %lld, throughput: %.1f infer/sec, latency %.0f usec%s%s\n",
                open_loop ? "Request rate" : "Concurrency", static_cast<long long>(level),
                r.throughput, r.latency_us,
                open_loop ? (", achieved " + Fmt1(r.request_rate) + " req/s").c_str() : "",
                r.stable ? "" : " (unstable)");
    // gRPC's synchronous stub writes and reads inside one call: no send/recv split there.
    char send_recv[96];
    if (o.protocol == "grpc") {
      std::snprintf(send_recv, sizeof(send_recv), "send/recv not separable over gRPC");
    } else {
      std::snprintf(send_recv, sizeof(send_recv), "send %.0f us, recv %.0f us", r.send_us, r.recv_us);
    }
    std::printf("  Client: %llu requests, %llu failed, avg %.0f us, p50 %.0f, p90 %.0f, p95 %.0f, p99 %.0f us; %s\n",
                static_cast<unsigned long long>(r.requests), static_cast<unsigned long long>(r.failed),
                r.avg_us, r.p50_us, r.p90_us, r.p95_us, r.p99_us, send_recv);
    std::printf("  Server: %llu requests, avg request %.0f us (queue %.0f, compute input %.0f, "
                "compute infer %.0f, compute output %.0f)\n",
                static_cast<unsigned long long>(r.server.requests), r.server.total_us,
                r.server.queue_us, r.server.compute_input_us, r.server.compute_infer_us,
                r.server.compute_output_us);
    std::fflush(stdout);
    if (open_loop && r.request_rate < 0.9 * static_cast<double>(level)) {
      std::fprintf(stderr, "  warning: achieved %.1f of %lld req/s: the server, or the %lld sending "
                   "connections (--max-threads), cannot keep up\n",
                   r.request_rate, static_cast<long long>(level), static_cast<long long>(o.max_threads));
    }
    steps.push_back(r);
  }
  if (!o.csv_file.empty()) {
    std::ofstream f(o.csv_file);
    f << CsvHeader(open_loop) << "\n";
    for (const auto& s : steps) f << CsvRow(s) << "\n";
    if (!f) std::cerr << "inferd-perf: cannot write '" << o.csv_file << "'\n";
  }
  if (!o.report_file.empty()) {
    std::ofstream f(o.report_file);
    f << HtmlReport("inferd-perf: " + o.model + " over " + o.protocol, open_loop, steps);
    if (!f) std::cerr << "inferd-perf: cannot write '" << o.report_file << "'\n";
  }
  if (ok_total == 0 && failed_total > 0) {
    std::cerr << "inferd-perf: every request failed\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace inferd::perf

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto o = inferd::perf::ParseOptions(args);
  if (!o.ok()) {
    std::cerr << "inferd-perf: " << o.status().message() << "\n";
    return 2;
  }
  if (o->help) {
    std::cout << inferd::perf::Usage();
    return 0;
  }
  // The firewall: a library exception (allocation, gRPC, the standard library) ends the run
  // with a message rather than std::terminate.
  try {
    return inferd::perf::Run(*o);
  } catch (const std::exception& e) {
    std::cerr << "inferd-perf: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "inferd-perf: unknown exception\n";
  }
  return 1;
}
