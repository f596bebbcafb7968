// The request and response types every layer shares. Frontends build an InferRequest whose
// tensors are views into the bytes the client sent (no copy); schedulers and backends read it;
// the backend fills an InferResponse whose outputs are views kept alive by a holder; the
// frontend serializes it on the I/O thread that owns the connection.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/data_type.h"
#include "common/memory_place.h"
#include "core/cancellation.h"

namespace inferd::core {

// Where a tensor lives in a registered system shared-memory region (the shared-memory
// extension's shared_memory_region / _offset / _byte_size parameters). The server resolves it
// to a mapping before validation.
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// An input tensor as the client sent it. `data` points into InferRequest::payload or
// InferRequest::owned; for BYTES it holds elements as 4-byte little-endian length + bytes.
struct InputTensor {
  std::string name;
  DataType datatype = DataType::kInvalid;
  Shape shape;
  std::string_view data;
  // Set by the frontend when the data is in shared memory; the server points `data` there.
  std::optional<SharedMemoryRef> shm;
  // Where `data` points (Triton's memory type and id). Host by default; a GPU place is for
  // bytes in a CUDA shared-memory region or an ensemble step's GPU output, which the server
  // leaves on the GPU only for a model whose instances take GPU inputs there
  // (ModelInstance::GpuInputsOn) and copies to the host otherwise (backends/tensor_places.h).
  MemoryPlace place;
};

struct RequestedOutput {
  std::string name;
  // Frontend hint: send this output in the binary section of the response.
  bool binary = false;
  // Classification extension: return the top-N as BYTES "<value>:<index>[:<label>]" (0 = off).
  int64_t classification = 0;
  // Write this output into shared memory instead of the response body.
  std::optional<SharedMemoryRef> shm;
  // Set by the server when `shm` is a CUDA shared-memory region on GPU n and nothing reads the
  // output between the instance and the region (no response cache, no classification): an
  // instance on GPU n may leave the output in its device memory, and the server copies it
  // device-to-device into the region (backends/tensor_places.h OutputMayStayOnGpu).
  std::optional<int> gpu_region_on;
};

// Monotonic nanosecond timestamps of one request's life, for the statistics extension.
struct RequestTimes {
  uint64_t received_ns = 0;
  uint64_t queue_start_ns = 0;
  uint64_t compute_start_ns = 0;
  uint64_t compute_input_end_ns = 0;
  uint64_t compute_output_start_ns = 0;
  uint64_t compute_end_ns = 0;
};

// An output tensor. `data` stays valid while `holder` is alive; BYTES outputs use the same
// 4-byte length-prefixed layout as inputs.
struct OutputTensor {
  std::string name;
  DataType datatype = DataType::kInvalid;
  Shape shape;
  std::string_view data;
  std::shared_ptr<const void> holder;
  // The server wrote the data into the shared-memory region the client named; the response
  // carries only its name, datatype and shape.
  bool in_shared_memory = false;
  // Where `data` points. Host by default. GPU n: a GPU instance left it there
  // (ModelInstance::OutputsMayBeOnGpu); it reaches only consumers that read GPU bytes (a CUDA
  // shared-memory region, an ensemble's next step), and the server copies it to the host for
  // every other (backends/tensor_places.h), so frontends serialize `data` as host bytes.
  MemoryPlace place;
};

// A parameter a model sets on its response (Triton's TRITONBACKEND_ResponseSet*Parameter;
// the Python backend's InferenceResponse(parameters=...)): the response's "parameters" in
// HTTP's JSON and gRPC's map.
struct ResponseParameter {
  std::string name;
  std::variant<bool, int64_t, std::string> value;
};

struct InferResponse {
  absl::Status status;
  std::string model_name;
  int64_t model_version = -1;
  std::string id;
  std::vector<OutputTensor> outputs;
  std::vector<ResponseParameter> parameters;
};

using InferCallback = std::function<void(std::unique_ptr<InferResponse>)>;
// One response of a request that may get several (decoupled models, core/response_sender.h);
// `final` marks the last call, whose response may be null (the final flag alone).
using ResponseCallback = std::function<void(std::unique_ptr<InferResponse>, bool final)>;
class ResponseSender;

// Triton's correlation ID (the `sequence_id` parameter): an unsigned integer or a string. Zero
// or the empty string means none.
struct CorrelationId {
  uint64_t number = 0;
  std::string text;
  bool is_string = false;
  bool empty() const { return is_string ? text.empty() : number == 0; }
};

// A sampled request's trace (the trace extension; server/trace.h makes them). The request
// hands itself to Finish when it is destroyed, which is after its answer was handed on.
struct InferRequest;
class RequestTrace {
 public:
  virtual ~RequestTrace() = default;
  virtual void Finish(const InferRequest& request, uint64_t end_ns) = 0;
};

// One inference request. Owned by exactly one layer at a time (moved as unique_ptr from the
// frontend to the server to a scheduler); the layer that owns it when it finishes calls
// `on_complete` exactly once. Not thread-safe: only the owner touches it.
struct InferRequest {
  std::string model_name;
  int64_t model_version = -1;  // -1: the newest ready version.
  std::string id;
  std::vector<InputTensor> inputs;
  std::vector<RequestedOutput> outputs;  // empty: every output of the model.
  uint32_t priority = 0;
  // Sequence batcher parameters (sequence_id, sequence_start, sequence_end).
  CorrelationId sequence_id;
  bool sequence_start = false;
  bool sequence_end = false;
  // The `timeout` parameter (microseconds), as Triton: the queue policy decides whether it
  // applies (allow_timeout_override); the default scheduler applies it from `received_ns`.
  uint64_t timeout_us = 0;
  // The client's own deadline (gRPC deadline), monotonic ns; 0: none. Always applies: past it
  // nobody waits for the answer, so a queued request is answered DEADLINE_EXCEEDED unrun.
  uint64_t deadline_ns = 0;
  // The request's parameters other than the ones above (and binary_data_output), as a JSON
  // object ("{\"k\":1}"); empty: none. Handed to backends that show them to the model
  // (Triton's Python backend: request.parameters()).
  std::string parameters;
  // Set by the frontend when the client can go away (see cancellation.h); null: never.
  std::shared_ptr<CancellationToken> cancel;

  // Keeps the bytes that `inputs[i].data` view alive (an HTTP body, a gRPC message, ...).
  std::shared_ptr<const void> payload;
  // Buffers the frontend decoded tensors into (JSON data). A list never moves its elements
  // and, unlike a deque, allocates nothing while empty (most requests: binary or raw data).
  std::list<std::string> owned;
  // Keeps other memory the tensors view alive (shared-memory mappings).
  std::vector<std::shared_ptr<const void>> holders;

  RequestTimes times;
  // Set by the server when the trace extension sampled this request; null otherwise.
  std::unique_ptr<RequestTrace> trace;
  InferCallback on_complete;
  // Set by frontends that take several responses per request (gRPC ModelStreamInfer, HTTP
  // generate/generate_stream); the server answers decoupled models through it and refuses
  // them when it is unset. A model that is not decoupled answers once, with final=true.
  ResponseCallback on_response;
  // Set by the server for decoupled models: where the backend sends its responses.
  std::shared_ptr<ResponseSender> response_sender;
  // The one who reads the response reads GPU bytes too (an ensemble handing a step's outputs
  // to its next step): outputs a GPU instance left on its GPU reach `on_complete` there. False,
  // the default: every output reaching `on_complete` is host-readable (backends/tensor_places.h).
  bool gpu_outputs_ok = false;

  InferRequest() = default;
  InferRequest(InferRequest&&) = default;
  InferRequest& operator=(InferRequest&&) = default;
  ~InferRequest();  // Finishes `trace`, if any.

  const InputTensor* FindInput(std::string_view name) const;
  bool IsCancelled() const { return cancel != nullptr && cancel->IsCancelled(); }
  // Batch size: the first dimension of the first input when the model batches, else 1.
  int64_t batch_size = 1;
};

// Completes `request` with an error response carrying its model and id.
void CompleteWithError(std::unique_ptr<InferRequest> request, absl::Status status);

// The answer to a request the client cancelled before it ran (CANCELLED).
absl::Status CancelledError(const InferRequest& request, uint64_t now_ns);
// The answer to a request whose deadline passed while it waited (DEADLINE_EXCEEDED, 504),
// with the time it waited and the limit that applied.
absl::Status DeadlineError(const InferRequest& request, uint64_t now_ns, std::string_view limit);
// The same answers for a request known by its model's name and arrival time (one that waits
// for its model to load: server/model_resolver.h).
absl::Status CancelledError(std::string_view model_name, uint64_t received_ns, uint64_t now_ns);
absl::Status DeadlineError(std::string_view model_name, uint64_t received_ns, uint64_t now_ns,
                           std::string_view limit);

// Monotonic clock in nanoseconds.
uint64_t NowNs();

}  // namespace inferd::core
