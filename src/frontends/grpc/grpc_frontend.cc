#include "frontends/grpc/grpc_frontend.h"

#include <algorithm>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "config/model_config_util.h"
#include "frontends/grpc/grpc_codec.h"
#include "grpc_service.grpc.pb.h"
#include "health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "server/log_settings.h"

namespace inferd::grpcfe {
namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

void FillStatistics(const server::ModelStatistics& m, inference::ModelStatistics* out) {
  if (m.memory_bytes > 0) {
    auto* usage = out->add_memory_usage();
    usage->set_type("CPU");
    usage->set_id(0);
    usage->set_byte_size(static_cast<uint64_t>(m.memory_bytes));
  }
  for (const auto& [gpu, bytes] : m.gpu_memory_bytes) {
    auto* usage = out->add_memory_usage();
    usage->set_type("GPU");
    usage->set_id(gpu);
    usage->set_byte_size(static_cast<uint64_t>(bytes));
  }
  const auto& s = m.stats;
  out->set_name(m.name);
  out->set_version(m.version);
  out->set_last_inference(s.last_inference_ms);
  out->set_inference_count(s.inference_count);
  out->set_execution_count(s.execution_count);
  auto set = [](inference::StatisticDuration* d, const metrics::Duration& v) {
    d->set_count(v.count);
    d->set_ns(v.ns);
  };
  auto* is = out->mutable_inference_stats();
  set(is->mutable_success(), s.success);
  set(is->mutable_fail(), s.fail);
  set(is->mutable_queue(), s.queue);
  set(is->mutable_compute_input(), s.compute_input);
  set(is->mutable_compute_infer(), s.compute_infer);
  set(is->mutable_compute_output(), s.compute_output);
  set(is->mutable_cache_hit(), s.cache_hit);
  set(is->mutable_cache_miss(), s.cache_miss);
  for (const auto& [size, b] : s.batch_stats) {
    auto* bs = out->add_batch_stats();
    bs->set_batch_size(size);
    set(bs->mutable_compute_input(), b.compute_input);
    set(bs->mutable_compute_infer(), b.compute_infer);
    set(bs->mutable_compute_output(), b.compute_output);
  }
}

// The client's deadline of a call, on core::NowNs's clock (0: none), taken 1 ms early: gRPC
// cancels the call on its own timer and clock when the deadline passes, and the schedulers count
// a cancelled request as a timeout only when their clock is past the deadline; read on two
// clocks, that race was sometimes lost (a deadline counted CANCELED).
constexpr int64_t kDeadlineLeadNs = 1'000'000;
uint64_t DeadlineNs(const CallbackServerContext* ctx) {
  const auto deadline = ctx->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return 0;
  const auto left = deadline - std::chrono::system_clock::now();
  const int64_t left_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  if (left_ns > int64_t{365} * 24 * 3600 * 1'000'000'000) return 0;  // "infinite" in practice
  return core::NowNs() + static_cast<uint64_t>(std::max<int64_t>(left_ns - kDeadlineLeadNs, 1));
}

// A unary ModelInfer: the call's cancellation (the client cancelling, its connection going, its
// deadline passing) cancels the request, so a queued request never runs and a running batch
// whose clients all left stops. Deletes itself once the call is done.
class InferReactor : public ServerUnaryReactor {
 public:
  explicit InferReactor(const CallbackServerContext* ctx)
      : deadline_ns_(DeadlineNs(ctx)), cancel_(std::make_shared<core::CancellationToken>()) {}
  uint64_t deadline_ns() const { return deadline_ns_; }
  const std::shared_ptr<core::CancellationToken>& cancellation() const { return cancel_; }
  void OnCancel() override { cancel_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  const uint64_t deadline_ns_;
  const std::shared_ptr<core::CancellationToken> cancel_;
};

// One ModelStreamInfer call: reads requests, runs them concurrently, writes each response as
// it completes (one write in flight at a time), and finishes once the client has stopped
// sending and every response is written.
class StreamReactor
    : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                     inference::ModelStreamInferResponse> {
 public:
  StreamReactor(server::Server* server, int max_in_flight)
      : server_(server), max_in_flight_(max_in_flight) {
    NextRead();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      inferd::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    auto message = std::move(incoming_);
    {
      inferd::MutexLock lock(&mu_);
      ++in_flight_;
    }
    // Decoupled models answer 0..N times; each response carries triton_final_response, and
    // the final flag alone is written only when the client asked for it, as Triton does.
    bool empty_final = false;
    absl::Status param = EmptyFinalParameter(*message, &empty_final);
    auto parsed = param.ok() ? RequestFromProto(*message, message)
                             : absl::StatusOr<std::unique_ptr<core::InferRequest>>(param);
    if (!parsed.ok()) {
      auto error = std::make_unique<core::InferResponse>();
      error->status = parsed.status();
      Complete(*message, empty_final, std::move(error), /*final=*/true);
    } else {
      std::unique_ptr<core::InferRequest> req = *std::move(parsed);
      req->times.received_ns = core::NowNs();
      req->cancel = Track();
      req->on_response = [this, message, empty_final](std::unique_ptr<core::InferResponse> resp,
                                                      bool final) {
        Complete(*message, empty_final, std::move(resp), final);
      };
      server_->Infer(std::move(req));
    }
    {
      // Backpressure: at the bound, read no more until a request completes (Complete resumes).
      inferd::MutexLock lock(&mu_);
      if (max_in_flight_ > 0 && in_flight_ >= max_in_flight_) {
        read_paused_ = true;
        return;
      }
    }
    NextRead();
  }

  void OnWriteDone(bool ok) override {
    inferd::MutexLock lock(&mu_);
    writes_.pop_front();
    writing_ = false;
    if (!ok) broken_ = true;
    WriteNextLocked();
    MaybeFinishLocked();
  }

  // A completion that called Finish() may still hold mu_ (gRPC can run OnDone on another
  // thread at once): wait for it to let go before the reactor, and mu_, are freed.
  void OnDone() override {
    { inferd::MutexLock lock(&mu_); }
    delete this;
  }
  // The stream was cancelled (the client cancelled it or went away): what it has in flight
  // is cancelled too.
  void OnCancel() override {
    std::vector<std::shared_ptr<core::CancellationToken>> tokens;
    {
      inferd::MutexLock lock(&mu_);
      cancelled_ = true;
      for (auto& weak : tokens_) {
        if (auto t = weak.lock()) tokens.push_back(std::move(t));
      }
    }
    for (auto& t : tokens) t->Cancel();
  }

 private:
  void NextRead() {
    incoming_ = std::make_shared<inference::ModelInferRequest>();
    StartRead(incoming_.get());
  }

  static absl::Status EmptyFinalParameter(const inference::ModelInferRequest& message, bool* on) {
    auto it = message.parameters().find("triton_enable_empty_final_response");
    if (it == message.parameters().end()) return absl::OkStatus();
    if (!it->second.has_bool_param()) {
      return absl::InvalidArgumentError(
          "invalid value type for 'triton_enable_empty_final_response' parameter, expected "
          "bool_param.");
    }
    *on = it->second.bool_param();
    return absl::OkStatus();
  }

  // One response of `request` (null: the final flag alone); `final` ends the request.
  void Complete(const inference::ModelInferRequest& request, bool empty_final,
                std::unique_ptr<core::InferResponse> resp, bool final) {
    std::optional<inference::ModelStreamInferResponse> out;
    if (resp != nullptr || (final && empty_final)) {
      out.emplace();
      auto* infer = out->mutable_infer_response();
      if (resp != nullptr && resp->status.ok()) {
        ResponseToProto(*resp, infer);
      } else {
        if (resp != nullptr) out->set_error_message(std::string(resp->status.message()));
        infer->set_id(request.id());
        infer->set_model_name(request.model_name());
        infer->set_model_version(request.model_version());
      }
      (*infer->mutable_parameters())["triton_final_response"].set_bool_param(final);
    }
    inferd::MutexLock lock(&mu_);
    if (final) --in_flight_;
    if (out && !broken_) writes_.push_back(*std::move(out));
    WriteNextLocked();
    MaybeFinishLocked();
    if (read_paused_ && in_flight_ < max_in_flight_) {
      read_paused_ = false;
      NextRead();
    }
  }

  // A cancellation token for a request of this stream, cancelled by OnCancel. Tokens are held
  // weakly: a completed request's token goes with it.
  std::shared_ptr<core::CancellationToken> Track() {
    auto token = std::make_shared<core::CancellationToken>();
    inferd::MutexLock lock(&mu_);
    if (cancelled_) token->Cancel();
    if (tokens_.size() >= 16 && tokens_.size() >= 2 * static_cast<size_t>(in_flight_)) {
      std::erase_if(tokens_, [](const std::weak_ptr<core::CancellationToken>& t) { return t.expired(); });
    }
    tokens_.push_back(token);
    return token;
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || writes_.empty() || broken_) return;
    writing_ = true;
    // With more messages queued behind this one (a decoupled model streaming), let gRPC
    // coalesce them: the last one, written without the hint, flushes them all.
    grpc::WriteOptions options;
    if (writes_.size() > 1) options.set_buffer_hint();
    StartWrite(&writes_.front(), options);
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || in_flight_ > 0 || writing_) return;
    if (!writes_.empty() && !broken_) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }

  server::Server* server_;
  std::shared_ptr<inference::ModelInferRequest> incoming_;
  inferd::Mutex mu_;
  std::deque<inference::ModelStreamInferResponse> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  const int max_in_flight_;  // 0: unbounded
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<core::CancellationToken>> tokens_ ABSL_GUARDED_BY(mu_);
};

// A ModelStreamInfer call refused before it starts.
class RefusedStream
    : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                     inference::ModelStreamInferResponse> {
 public:
  explicit RefusedStream(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

class GrpcFrontend::Service final : public inference::GRPCInferenceService::CallbackService {
 public:
  Service(server::Server* server, ApiRestrictions restrictions, int stream_max_in_flight = 0)
      : server_(server), restrictions_(std::move(restrictions)),
        stream_max_in_flight_(stream_max_in_flight) {}

  // Checks --grpc-restricted-protocol for a call of `category`: null when the call may go on,
  // else the reactor that has refused it (UNAVAILABLE, as tritonserver answers).
  ServerUnaryReactor* Refuse(CallbackServerContext* ctx, ApiCategory category) {
    return Allowed(ctx, category) ? nullptr : Done(ctx, Refusal(category));
  }

  bool Allowed(CallbackServerContext* ctx, ApiCategory category) const {
    const auto& rule = restrictions_.Find(category);
    if (!rule) return true;
    std::string key = rule->key;
    std::transform(key.begin(), key.end(), key.begin(), ::tolower);  // gRPC keys are lowercase
    const auto& md = ctx->client_metadata();
    auto it = md.find(key);
    return it != md.end() && std::string_view(it->second.data(), it->second.size()) == rule->value;
  }

  grpc::Status Refusal(ApiCategory category) const {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        StrCat("This protocol is restricted, expecting header '",
                               restrictions_.Find(category)->key, "'"));
  }

  ServerUnaryReactor* ServerLive(CallbackServerContext* ctx, const inference::ServerLiveRequest*,
                                 inference::ServerLiveResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kHealth)) return refused;
    resp->set_live(server_->IsLive());
    return Done(ctx, grpc::Status::OK);
  }

  ServerUnaryReactor* ServerReady(CallbackServerContext* ctx, const inference::ServerReadyRequest*,
                                  inference::ServerReadyResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kHealth)) return refused;
    resp->set_ready(server_->IsReady());
    return Done(ctx, grpc::Status::OK);
  }

  ServerUnaryReactor* ModelReady(CallbackServerContext* ctx, const inference::ModelReadyRequest* req,
                                 inference::ModelReadyResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kHealth)) return refused;
    auto v = ParseVersion(req->version());
    if (!v.ok()) return Done(ctx, ToGrpcStatus(v.status()));
    resp->set_ready(server_->IsModelReady(req->name(), *v));
    return Done(ctx, grpc::Status::OK);
  }

  ServerUnaryReactor* ServerMetadata(CallbackServerContext* ctx,
                                     const inference::ServerMetadataRequest*,
                                     inference::ServerMetadataResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kMetadata)) return refused;
    resp->set_name(server_->id());
    resp->set_version(std::string(server::Server::kVersion));
    for (const auto& e : server_->Extensions()) resp->add_extensions(e);
    return Done(ctx, grpc::Status::OK);
  }

  ServerUnaryReactor* ModelMetadata(CallbackServerContext* ctx,
                                    const inference::ModelMetadataRequest* req,
                                    inference::ModelMetadataResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kMetadata)) return refused;
    auto v = ParseVersion(req->version());
    if (!v.ok()) return Done(ctx, ToGrpcStatus(v.status()));
    // The server resolves the model (an on-demand one loads first: the reactor then finishes
    // on the loader thread).
    auto* reactor = ctx->DefaultReactor();
    server_->GetModelMetadata(req->name(), *v, {}, [reactor, resp](
                                                       absl::StatusOr<server::ModelMetadata> md) {
      if (!md.ok()) return reactor->Finish(ToGrpcStatus(md.status()));
      resp->set_name(md->name);
      for (const auto& ver : md->versions) resp->add_versions(ver);
      resp->set_platform(md->platform);
      auto fill = [](const server::TensorMetadata& t, auto* out) {
        out->set_name(t.name);
        out->set_datatype(std::string(DataTypeName(t.datatype)));
        for (int64_t d : t.shape) out->add_shape(d);
      };
      for (const auto& t : md->inputs) fill(t, resp->add_inputs());
      for (const auto& t : md->outputs) fill(t, resp->add_outputs());
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  ServerUnaryReactor* ModelInfer(CallbackServerContext* ctx, const inference::ModelInferRequest* req,
                                 inference::ModelInferResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kInference)) return refused;
    auto* reactor = new InferReactor(ctx);
    try {
      const uint64_t received = core::NowNs();
      // The request message lives until Finish, so raw inputs are used in place.
      auto parsed = RequestFromProto(*req, nullptr);
      if (!parsed.ok()) {
        reactor->Finish(ToGrpcStatus(parsed.status()));
        return reactor;
      }
      std::unique_ptr<core::InferRequest> r = *std::move(parsed);
      r->times.received_ns = received;
      r->deadline_ns = reactor->deadline_ns();
      r->cancel = reactor->cancellation();
      r->on_complete = [reactor, resp](std::unique_ptr<core::InferResponse> out) {
        if (!out->status.ok()) {
          reactor->Finish(ToGrpcStatus(out->status));
          return;
        }
        ResponseToProto(*out, resp);
        reactor->Finish(grpc::Status::OK);
      };
      server_->Infer(std::move(r));
    } catch (const std::exception& e) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, StrCat("internal error: ", e.what())));
    }
    return reactor;
  }

  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(CallbackServerContext* ctx) override {
    if (!Allowed(ctx, ApiCategory::kInference)) return new RefusedStream(Refusal(ApiCategory::kInference));
    return new StreamReactor(server_, stream_max_in_flight_);
  }

  ServerUnaryReactor* ModelConfig(CallbackServerContext* ctx, const inference::ModelConfigRequest* req,
                                  inference::ModelConfigResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kModelConfig)) return refused;
    auto v = ParseVersion(req->version());
    if (!v.ok()) return Done(ctx, ToGrpcStatus(v.status()));
    auto* reactor = ctx->DefaultReactor();
    server_->GetModelConfig(req->name(), *v, {}, [reactor, resp](
                                                     absl::StatusOr<const config::ModelConfig*> cfg) {
      if (!cfg.ok()) return reactor->Finish(ToGrpcStatus(cfg.status()));
      *resp->mutable_config() = **cfg;
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  ServerUnaryReactor* ModelStatistics(CallbackServerContext* ctx,
                                      const inference::ModelStatisticsRequest* req,
                                      inference::ModelStatisticsResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kStatistics)) return refused;
    auto v = ParseVersion(req->version());
    if (!v.ok()) return Done(ctx, ToGrpcStatus(v.status()));
    auto stats = server_->GetStatistics(req->name(), *v);
    if (!stats.ok()) return Done(ctx, ToGrpcStatus(stats.status()));
    for (const auto& m : *stats) FillStatistics(m, resp->add_model_stats());
    return Done(ctx, grpc::Status::OK);
  }

  ServerUnaryReactor* RepositoryIndex(CallbackServerContext* ctx,
                                      const inference::RepositoryIndexRequest* req,
                                      inference::RepositoryIndexResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kModelRepository)) return refused;
    for (const auto& e : server_->RepositoryIndex(req->ready())) {
      auto* m = resp->add_models();
      m->set_name(e.name);
      m->set_version(e.version);
      m->set_state(e.state);
      m->set_reason(e.reason);
    }
    return Done(ctx, grpc::Status::OK);
  }

  ServerUnaryReactor* RepositoryModelLoad(CallbackServerContext* ctx,
                                          const inference::RepositoryModelLoadRequest* req,
                                          inference::RepositoryModelLoadResponse*) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kModelRepository)) return refused;
    std::optional<std::string> config_json;
    std::map<std::string, std::string> files;  // "file:<path>" parameters
    for (const auto& [key, p] : req->parameters()) {
      if (key == "config") {
        if (!p.has_string_param()) {
          return Done(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        "parameter 'config' must be a string_param holding JSON"));
        }
        config_json = p.string_param();
      } else if (key.rfind("file:", 0) == 0) {
        // Triton's model file override: the file's content as bytes_param.
        if (!p.has_bytes_param()) {
          return Done(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        StrCat("parameter '", key, "' must be a bytes_param holding the file's content")));
        }
        files[key.substr(5)] = p.bytes_param();
      }
    }
    auto* reactor = ctx->DefaultReactor();
    server_->LoadModel(
        req->model_name(), std::move(config_json),
        [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); }, std::move(files));
    return reactor;
  }

  ServerUnaryReactor* RepositoryModelUnload(CallbackServerContext* ctx,
                                            const inference::RepositoryModelUnloadRequest* req,
                                            inference::RepositoryModelUnloadResponse*) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kModelRepository)) return refused;
    bool unload_dependents = false;
    if (auto it = req->parameters().find("unload_dependents"); it != req->parameters().end()) {
      if (!it->second.has_bool_param()) {
        return Done(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                      "parameter 'unload_dependents' must be a bool_param"));
      }
      unload_dependents = it->second.bool_param();
    }
    auto* reactor = ctx->DefaultReactor();
    server_->UnloadModel(
        req->model_name(), [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); },
        unload_dependents);
    return reactor;
  }

  ServerUnaryReactor* SystemSharedMemoryStatus(CallbackServerContext* ctx,
                                               const inference::SystemSharedMemoryStatusRequest* req,
                                               inference::SystemSharedMemoryStatusResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kSharedMemory)) return refused;
    auto regions = server_->shared_memory().Status(req->name());
    if (!regions.ok()) return Done(ctx, ToGrpcStatus(regions.status()));
    for (const auto& r : *regions) {
      auto& out = (*resp->mutable_regions())[r.name];
      out.set_name(r.name);
      out.set_key(r.key);
      out.set_offset(r.offset);
      out.set_byte_size(r.byte_size);
    }
    return Done(ctx, grpc::Status::OK);
  }
  ServerUnaryReactor* SystemSharedMemoryRegister(CallbackServerContext* ctx,
                                                 const inference::SystemSharedMemoryRegisterRequest* req,
                                                 inference::SystemSharedMemoryRegisterResponse*) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kSharedMemory)) return refused;
    return Done(ctx, ToGrpcStatus(server_->shared_memory().Register(req->name(), req->key(),
                                                                   req->offset(), req->byte_size())));
  }
  ServerUnaryReactor* SystemSharedMemoryUnregister(CallbackServerContext* ctx,
                                                   const inference::SystemSharedMemoryUnregisterRequest* req,
                                                   inference::SystemSharedMemoryUnregisterResponse*) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kSharedMemory)) return refused;
    return Done(ctx, ToGrpcStatus(server_->shared_memory().Unregister(req->name())));
  }
  // The CUDA regions share the manager's name space with the system ones, as in Triton.
  ServerUnaryReactor* CudaSharedMemoryStatus(CallbackServerContext* ctx,
                                             const inference::CudaSharedMemoryStatusRequest* req,
                                             inference::CudaSharedMemoryStatusResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kSharedMemory)) return refused;
    auto regions = server_->shared_memory().Status(req->name(), MemoryType::kGpu);
    if (!regions.ok()) return Done(ctx, ToGrpcStatus(regions.status()));
    for (const auto& r : *regions) {
      auto& out = (*resp->mutable_regions())[r.name];
      out.set_name(r.name);
      out.set_device_id(static_cast<uint64_t>(r.device_id));
      out.set_byte_size(r.byte_size);
    }
    return Done(ctx, grpc::Status::OK);
  }
  ServerUnaryReactor* CudaSharedMemoryRegister(CallbackServerContext* ctx,
                                               const inference::CudaSharedMemoryRegisterRequest* req,
                                               inference::CudaSharedMemoryRegisterResponse*) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kSharedMemory)) return refused;
    return Done(ctx, ToGrpcStatus(server_->shared_memory().RegisterCuda(
                         req->name(), req->raw_handle(), req->device_id(), req->byte_size())));
  }
  ServerUnaryReactor* CudaSharedMemoryUnregister(CallbackServerContext* ctx,
                                                 const inference::CudaSharedMemoryUnregisterRequest* req,
                                                 inference::CudaSharedMemoryUnregisterResponse*) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kSharedMemory)) return refused;
    return Done(ctx, ToGrpcStatus(server_->shared_memory().Unregister(req->name(),
                                                                     MemoryType::kGpu)));
  }
  ServerUnaryReactor* TraceSetting(CallbackServerContext* ctx, const inference::TraceSettingRequest* req,
                                   inference::TraceSettingResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kTrace)) return refused;
    const std::string& model = req->model_name();
    if (!model.empty() && !server_->IsModelReady(model, -1)) {
      return Done(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    StrCat("Request for unknown model : ", model)));
    }
    if (!req->settings().empty()) {
      // A setting with no value hands a model's field back to the global setting.
      std::map<std::string, server::TraceSettingValue> settings;
      for (const auto& [key, value] : req->settings()) {
        server::TraceSettingValue v;
        v.null = value.value().empty();
        v.values.assign(value.value().begin(), value.value().end());
        settings.emplace(key, std::move(v));
      }
      absl::Status st = server_->trace().Update(model, settings);
      if (!st.ok()) return Done(ctx, ToGrpcStatus(st));
    }
    for (const auto& [key, values] : server_->trace().Describe(model)) {
      auto& out = (*resp->mutable_settings())[key];
      for (const auto& v : values) out.add_value(v);
    }
    return Done(ctx, grpc::Status::OK);
  }
  ServerUnaryReactor* LogSettings(CallbackServerContext* ctx, const inference::LogSettingsRequest* req,
                                  inference::LogSettingsResponse* resp) override {
    if (auto* refused = Refuse(ctx, ApiCategory::kLogging)) return refused;
    std::map<std::string, server::LogSettingValue> settings;
    for (const auto& [key, value] : req->settings()) {
      server::LogSettingValue v;
      switch (value.parameter_choice_case()) {
        case inference::LogSettingsRequest::SettingValue::kBoolParam:
          v.kind = server::LogSettingValue::kBool;
          v.b = value.bool_param();
          break;
        case inference::LogSettingsRequest::SettingValue::kUint32Param:
          v.kind = server::LogSettingValue::kUint;
          v.u = value.uint32_param();
          break;
        case inference::LogSettingsRequest::SettingValue::kStringParam:
          v.kind = server::LogSettingValue::kString;
          v.s = value.string_param();
          break;
        default:
          v.kind = server::LogSettingValue::kNull;
      }
      settings.emplace(key, std::move(v));
    }
    if (absl::Status st = server::UpdateLogSettings(settings); !st.ok()) {
      return Done(ctx, ToGrpcStatus(st));
    }
    const server::LogSettingsView cur = server::CurrentLogSettings();
    auto& out = *resp->mutable_settings();
    out["log_file"].set_string_param(cur.log_file);
    out["log_info"].set_bool_param(cur.log_info);
    out["log_warning"].set_bool_param(cur.log_warning);
    out["log_error"].set_bool_param(cur.log_error);
    out["log_verbose_level"].set_uint32_param(cur.log_verbose_level);
    out["log_format"].set_string_param(cur.log_format);
    return Done(ctx, grpc::Status::OK);
  }

 private:
  static ServerUnaryReactor* Done(CallbackServerContext* ctx, const grpc::Status& status) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  server::Server* server_;
  ApiRestrictions restrictions_;
  const int stream_max_in_flight_;
};

// grpc.health.v1.Health/Check as tritonserver answers it (CommonHandler::RegisterHealthCheck):
// SERVING when the server is ready (what GET /v2/health/ready says), else NOT_SERVING, whatever
// `service` names; under the `health` restricted-protocol category. Kubernetes `grpc` probes
// and grpc_health_probe call it.
class GrpcFrontend::HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  // `GrpcFrontend::Service` in full: inside this class `Service` names gRPC's base class.
  HealthService(server::Server* server, const GrpcFrontend::Service* service)
      : server_(server), service_(service) {}

  ServerUnaryReactor* Check(CallbackServerContext* ctx, const grpc::health::v1::HealthCheckRequest*,
                            grpc::health::v1::HealthCheckResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!service_->Allowed(ctx, ApiCategory::kHealth)) {
      reactor->Finish(service_->Refusal(ApiCategory::kHealth));
      return reactor;
    }
    resp->set_status(server_->IsReady() ? grpc::health::v1::HealthCheckResponse::SERVING
                                        : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  server::Server* server_;
  const GrpcFrontend::Service* service_;  // its --grpc-restricted-protocol check
};

GrpcFrontend::GrpcFrontend(server::Server* server, GrpcOptions options)
    : server_(server), options_(std::move(options)),
      service_(std::make_unique<Service>(server, options_.restrictions,
                                         options_.stream_max_in_flight)),
      health_service_(std::make_unique<HealthService>(server, service_.get())) {}

GrpcFrontend::~GrpcFrontend() { Stop(); }

absl::Status GrpcFrontend::Start() {
  grpc::ServerBuilder builder;
  const std::string address = StrCat(options_.address, ":", options_.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  builder.RegisterService(health_service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(-1);
  if (options_.infer_threads > 0) {
    grpc::ResourceQuota quota("inferd");
    quota.SetMaxThreads(options_.infer_threads);
    builder.SetResourceQuota(quota);
  }
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    return absl::UnavailableError(StrCat("cannot listen for gRPC on ", address));
  }
  return absl::OkStatus();
}

void GrpcFrontend::Stop() {
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc_server_->Wait();
    grpc_server_.reset();
  }
}

}  // namespace inferd::grpcfe
