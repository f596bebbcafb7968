// The backend toolkit: what every backend that runs a batch as one tensor per input needs
// between the scheduler's requests and its runtime (Triton's backend-common
// BackendInputCollector / BackendOutputResponder idea). A backend then only maps a contiguous
// batch to its runtime's tensors and back:
//
//   BatchInputCollector in(requests, batching, &batch_buffers_);
//   for each config input:  auto batch = in.Gather(cfg);      // one contiguous [B, ...] tensor
//   ... run ...
//   BatchOutputResponder out(requests, responses, batching);
//   for each output:        out.Respond(cfg, name, type, shape, bytes, holder);
//
// Gathering concatenates the requests' inputs in request order into a BatchBuffer the instance
// keeps across batches (no allocation per batch once it has grown to the largest batch); a
// batch of one request uses the request's own bytes (no copy). Responding slices a batch output
// back to each request by its batch size, as views of the one output buffer, and only to the
// requests that asked for that output. BYTES tensors use the wire layout everywhere: each
// element is a 4-byte little-endian length followed by its bytes.
//
// Memory placement: a runtime that copies its inputs to a device asks for them in pinned host
// memory (`MemoryPlacement::kPinnedHost`): the collector then gathers every batch, a lone
// request too, into a BatchBuffer whose memory comes from the runtime's pinned allocator, so the
// runtime copies each input to its device once per batch, asynchronously (the LibTorch backend
// on CUDA). Outputs come back to host memory in the runtime before they reach the responder.
//
// Thread safety: none. A collector, a responder and a BatchBuffer belong to one Execute call
// (a BatchBuffer to one instance, whose Execute runs on one thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data_type.h"
#include "common/memory_place.h"
#include "config/model_config_util.h"
#include "core/infer_request.h"

namespace inferd::backends {

// Where a batch tensor's bytes live (Triton's TRITONSERVER_MemoryType and its type id).
struct MemoryPlacement {
  // kHost: any host memory (a lone request's own bytes, no copy).
  // kPinnedHost: page-locked host memory a runtime copies to `device_id` asynchronously
  // (Triton's CPU_PINNED): always a BatchBuffer from the collector's pinned allocator.
  // kGpu: memory on GPU `device_id`; only an output's source (BatchOutputResponder::Respond:
  // the slices get that GPU place, for a consumer that reads GPU bytes).
  enum class Kind { kHost, kPinnedHost, kGpu };
  Kind kind = Kind::kHost;
  int device_id = 0;  // the GPU the runtime copies to (kPinnedHost), or holding it (kGpu)
};

// A contiguous host buffer kept by one instance across batches. Grows to the largest size asked
// for and never shrinks, so batches of a size already seen allocate nothing. Contents are not
// kept across Reserve calls that grow it.
class BatchBuffer {
 public:
  // Host memory from somewhere other than the heap (a runtime's pinned memory): `data` is
  // valid while `owner` lives; a null `data` means the allocation failed.
  struct Block {
    char* data = nullptr;
    std::shared_ptr<void> owner;
  };
  using Allocator = std::function<Block(size_t bytes)>;

  BatchBuffer() = default;
  // A buffer whose memory comes from `allocator` (null: the heap).
  explicit BatchBuffer(Allocator allocator) : allocator_(std::move(allocator)) {}

  // At least `bytes` writable bytes, valid until the next Reserve that grows the buffer; null
  // only when an allocator-backed buffer cannot grow.
  char* Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }
  // How many times the buffer allocated (tests check that a repeated batch reuses it).
  int allocations() const { return allocations_; }
  // True when the memory comes from an allocator (pinned), not the heap.
  bool allocator_backed() const { return allocator_ != nullptr; }

 private:
  Allocator allocator_;
  std::unique_ptr<char[]> data_;
  Block block_;  // the allocator's memory, when there is an allocator
  size_t capacity_ = 0;
  int allocations_ = 0;
};

// One input of a batch as a single tensor: every request's tensor for it, in request order.
struct BatchInput {
  std::string_view name;
  DataType datatype = DataType::kInvalid;
  // The shape the runtime runs with: the first request's (its `reshape` applied), with the batch
  // dimension summed over the requests when the batch has several.
  Shape shape;
  // Every request's bytes, one after the other (BYTES: the serialized elements). Points into
  // the request itself for a batch of one request, else into the collector's BatchBuffer; valid
  // until the batch's next Gather into the same buffer (the next batch), or the requests'
  // destruction. The memory a runtime's input tensors view: an output aliasing it must be
  // copied before it outlives the batch.
  std::string_view data;
  // Where `data` is: the host, or the GPU of TakeGpuInputs when some request's tensor was there.
  MemoryPlace place;
};

// Gathers the inputs of one batch. Does not own the requests or the buffers.
class BatchInputCollector {
 public:
  // `batching`: the model's max_batch_size > 0 (requests then carry a batch dimension, which
  // gathering sums). `buffers`: the instance's reusable buffers, one used per gathered input
  // that needs a copy (grown on demand); kept by the caller across batches.
  // `pinned`: the allocator of kPinnedHost gathers (null when the caller never asks for one).
  BatchInputCollector(std::span<core::InferRequest* const> requests, bool batching,
                      std::vector<BatchBuffer>* buffers, BatchBuffer::Allocator pinned = nullptr);

  // The sum of the requests' batch sizes.
  int64_t total_batch() const { return total_batch_; }

  // Queues a copy of `bytes` from `src` at `src_place` into device memory `dst` (on the
  // instance's stream: the caller waits for it before the runtime reads the batch).
  using DeviceCopier = std::function<absl::Status(void* dst, const void* src,
                                                  MemoryPlace src_place, size_t bytes)>;
  // Lets Gather take inputs on GPU `device` (InputTensor::place; an instance whose
  // ModelInstance::GpuInputsOn is `device`). An input whose tensors are all on the host is
  // gathered as before. One with a tensor on that GPU is gathered there: a lone request's own
  // bytes (no copy), else one copy per request (host-to-device or device-to-device, through
  // `copy`) into a buffer of `device_buffers` whose memory comes from `device_alloc`; the
  // BatchInput's place says which. Call before the first Gather.
  void TakeGpuInputs(int device, std::vector<BatchBuffer>* device_buffers,
                     BatchBuffer::Allocator device_alloc, DeviceCopier copy);

  // Gathers config input `cfg`. NOT_FOUND when the first request leaves the input out (an
  // optional input): the caller skips it. INVALID_ARGUMENT naming the input and the request
  // when a later request lacks it, has another datatype or other non-batch dims, or sends a
  // number of bytes (or BYTES elements) its shape does not hold.
  //
  // `destination`: where the runtime wants the batch. kPinnedHost gathers into a buffer from
  // the `pinned` allocator, a lone request too (RESOURCE_EXHAUSTED naming the input when it
  // cannot allocate; INTERNAL when the collector has no pinned allocator). A tensor on a GPU
  // the collector does not take (TakeGpuInputs), or a BYTES tensor on a GPU, is INTERNAL: the
  // server copies such tensors to the host before they reach an instance.
  absl::StatusOr<BatchInput> Gather(const inference::ModelInput& cfg,
                                    MemoryPlacement destination = {});

 private:
  // OK for a tensor on the GPU this collector takes; INTERNAL naming it otherwise.
  absl::Status CheckGpuTensor(const core::InputTensor& t, std::string_view who) const;

  std::span<core::InferRequest* const> requests_;
  const bool batching_;
  std::vector<BatchBuffer>* buffers_;
  BatchBuffer::Allocator pinned_;
  size_t next_buffer_ = 0;  // buffers_ used by this batch so far
  int64_t total_batch_ = 0;
  // TakeGpuInputs: the GPU (-1: none), its buffers and how to fill them.
  int gpu_ = -1;
  std::vector<BatchBuffer>* device_buffers_ = nullptr;
  BatchBuffer::Allocator device_alloc_;
  DeviceCopier copy_;
  size_t next_device_buffer_ = 0;
};

// Slices the outputs of one batch back to its requests. Does not own the requests or responses.
class BatchOutputResponder {
 public:
  BatchOutputResponder(std::span<core::InferRequest* const> requests,
                       std::span<core::InferResponse* const> responses, bool batching);

  // True when some request of the batch asked for output `name` (none named means all): the
  // outputs worth asking the runtime for.
  bool AnyRequested(std::string_view name) const;

  // Hands output `name` of the batch, `data` in `shape` (the runtime's [total_batch, ...] when
  // the batch has several requests), to every request that asked for it: request r gets its
  // batch_size rows as a view of `data`, kept alive by `holder`. BYTES data is serialized
  // (4-byte length + bytes per element) and split at element boundaries. `cfg` (may be null)
  // gives the output's `reshape`: the client then sees the config's dims. INTERNAL, naming the
  // output, when the batch output does not split by batch (its first dimension is not the
  // total batch, or its bytes do not hold its shape).
  //
  // `source`: where `data` lives: host memory (kHost, kPinnedHost), or kGpu for an output a
  // runtime left on its GPU (complete by now) for requests whose consumer reads GPU bytes
  // (InferRequest::gpu_outputs_ok): the outputs then carry that GPU place. Never BYTES
  // (INTERNAL).
  absl::Status Respond(const inference::ModelOutput* cfg, std::string_view name,
                       DataType datatype, const Shape& shape, std::string_view data,
                       std::shared_ptr<const void> holder, MemoryPlacement source = {});

 private:
  // The shape request r's client sees for a runtime shape whose batch dimension is `batch`.
  Shape ClientShape(const inference::ModelOutput* cfg, const Shape& runtime_shape,
                    int64_t batch) const;

  std::span<core::InferRequest* const> requests_;
  std::span<core::InferResponse* const> responses_;
  const bool batching_;
  int64_t total_batch_ = 0;
};

// Appends to `response` the tensors of `outputs` its request asked for (all when it named none):
// output filtering for a backend that produces each request's outputs on its own (the Python
// backend's model, DALI's pipeline, identity) rather than one batch output to slice.
void AddRequestedOutputs(const core::InferRequest& request,
                         std::vector<core::OutputTensor> outputs, core::InferResponse* response);

// ---- BYTES elements (4-byte little-endian length + bytes each) ----

// Appends one element to a serialized BYTES buffer.
void AppendBytesElement(std::string_view element, std::string* buffer);

// The number of elements in a serialized BYTES buffer; INVALID_ARGUMENT when it is not well
// formed (a truncated length or element).
absl::StatusOr<size_t> CountBytesElements(std::string_view buffer);

// The byte offset where each element starts, and the buffer's size last (count + 1 entries), so
// elements [i, j) are buffer.substr(offsets[i], offsets[j] - offsets[i]).
absl::StatusOr<std::vector<size_t>> BytesElementOffsets(std::string_view buffer);

}  // namespace inferd::backends
