#include "backends/batch_io.h"

#include <cstring>

#include "backends/backend.h"
#include "common/strings.h"

namespace inferd::backends {
namespace {

// "request 'id' (2 of 3)" or "request 2 of 3" for a request without an id: which request of
// the batch a gather error is about.
std::string RequestLabel(const core::InferRequest& request, size_t index, size_t count) {
  if (request.id.empty()) return inferd::StrCat("request ", index + 1, " of ", count);
  return inferd::StrCat("request '", request.id, "' (", index + 1, " of ", count, ")");
}

// The dims after the batch dimension (all of them when the model does not batch) are equal.
bool SameItemShape(const Shape& a, const Shape& b, bool batching) {
  if (a.size() != b.size()) return false;
  for (size_t i = batching ? 1 : 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// OK when `t`'s bytes hold its shape: element count x element size, or as many BYTES elements.
absl::Status CheckByteSize(const core::InputTensor& t, std::string_view who) {
  auto count = ElementCount(t.shape);
  if (!count.ok()) {
    return absl::InvalidArgumentError(
        inferd::StrCat("input '", t.name, "' of ", who, ": ", count.status().message()));
  }
  if (t.datatype == DataType::kBytes) {
    auto elements = CountBytesElements(t.data);
    if (!elements.ok()) {
      return absl::InvalidArgumentError(
          inferd::StrCat("input '", t.name, "' of ", who, ": ", elements.status().message()));
    }
    if (*elements != static_cast<size_t>(*count)) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", t.name, "' of ", who, " has shape ", ShapeToString(t.shape), " (", *count,
          " elements) but holds ", *elements, " BYTES elements"));
    }
    return absl::OkStatus();
  }
  const uint64_t expected = static_cast<uint64_t>(*count) * DataTypeSize(t.datatype);
  if (t.data.size() != expected) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "input '", t.name, "' of ", who, " has shape ", ShapeToString(t.shape), " and datatype ",
        DataTypeName(t.datatype), ", which needs ", expected, " bytes, but holds ",
        t.data.size()));
  }
  return absl::OkStatus();
}

}  // namespace

char* BatchBuffer::Reserve(size_t bytes) {
  if (allocator_ != nullptr) {
    if (bytes > capacity_ || block_.data == nullptr) {
      block_ = {};  // the old block goes back before the new one is asked for
      capacity_ = 0;
      Block block = allocator_(bytes == 0 ? 1 : bytes);
      if (block.data == nullptr) return nullptr;
      block_ = std::move(block);
      capacity_ = bytes;
      ++allocations_;
    }
    return block_.data;
  }
  if (bytes > capacity_ || data_ == nullptr) {
    // Uninitialized: every byte a gather uses is written before the runtime reads it.
    data_ = std::make_unique_for_overwrite<char[]>(bytes == 0 ? 1 : bytes);
    capacity_ = bytes;
    ++allocations_;
  }
  return data_.get();
}

BatchInputCollector::BatchInputCollector(std::span<core::InferRequest* const> requests,
                                         bool batching, std::vector<BatchBuffer>* buffers,
                                         BatchBuffer::Allocator pinned)
    : requests_(requests), batching_(batching), buffers_(buffers), pinned_(std::move(pinned)) {
  for (const auto* r : requests_) total_batch_ += r->batch_size;
}

void BatchInputCollector::TakeGpuInputs(int device, std::vector<BatchBuffer>* device_buffers,
                                        BatchBuffer::Allocator device_alloc, DeviceCopier copy) {
  gpu_ = device;
  device_buffers_ = device_buffers;
  device_alloc_ = std::move(device_alloc);
  copy_ = std::move(copy);
}

absl::Status BatchInputCollector::CheckGpuTensor(const core::InputTensor& t,
                                                 std::string_view who) const {
  if (gpu_ < 0 || t.place.device_id != gpu_ || t.datatype == DataType::kBytes) {
    return absl::InternalError(inferd::StrCat(
        "input '", t.name, "' of ", who, " is on ", t.place.ToString(),
        ", which this instance does not read (the server copies such inputs to the host)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BatchInput> BatchInputCollector::Gather(const inference::ModelInput& cfg,
                                                       MemoryPlacement destination) {
  const bool pinned = destination.kind == MemoryPlacement::Kind::kPinnedHost;
  if (destination.kind == MemoryPlacement::Kind::kGpu) {
    return absl::InternalError(inferd::StrCat(
        "input '", cfg.name(), "': a GPU destination is asked for with TakeGpuInputs"));
  }
  if (pinned && pinned_ == nullptr) {
    return absl::InternalError(inferd::StrCat(
        "input '", cfg.name(), "': pinned host memory asked for without a pinned allocator"));
  }
  const size_t n = requests_.size();
  if (n == 0) return absl::InvalidArgumentError("an empty batch has no inputs");
  const core::InputTensor* first = requests_[0]->FindInput(cfg.name());
  if (first == nullptr) {
    return absl::NotFoundError(inferd::StrCat("input '", cfg.name(), "' was left out"));
  }
  BatchInput batch;
  batch.name = cfg.name();
  batch.datatype = first->datatype;
  batch.shape = BackendInputShape(cfg, first->shape, batching_);
  if (n > 1 && !batch.shape.empty()) batch.shape[0] = total_batch_;

  if (n == 1 && !pinned) {
    if (!first->place.OnHost()) {
      if (auto st = CheckGpuTensor(*first, RequestLabel(*requests_[0], 0, 1)); !st.ok()) {
        return st;
      }
      batch.place = first->place;
    }
    if (auto st = CheckByteSize(*first, RequestLabel(*requests_[0], 0, 1)); !st.ok()) return st;
    // The request's own bytes, where they are: no copy.
    batch.data = first->data;
    return batch;
  }

  // Check every request before copying any: the byte counts size the buffer.
  size_t bytes = 0;
  bool on_gpu = false;
  for (size_t r = 0; r < n; ++r) {
    const core::InputTensor* t = r == 0 ? first : requests_[r]->FindInput(cfg.name());
    if (t == nullptr) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", cfg.name(), "' is left out by ", RequestLabel(*requests_[r], r, n),
          " but sent by the batch's first request"));
    }
    if (t->datatype != first->datatype || !SameItemShape(t->shape, first->shape, batching_)) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", cfg.name(), "' of ", RequestLabel(*requests_[r], r, n), " is ",
          DataTypeName(t->datatype), " ", ShapeToString(t->shape),
          ", which does not batch with the first request's ", DataTypeName(first->datatype), " ",
          ShapeToString(first->shape)));
    }
    if (!t->place.OnHost()) {
      if (auto st = CheckGpuTensor(*t, RequestLabel(*requests_[r], r, n)); !st.ok()) return st;
      on_gpu = true;
    }
    if (auto st = CheckByteSize(*t, RequestLabel(*requests_[r], r, n)); !st.ok()) return st;
    bytes += t->data.size();
  }

  if (on_gpu) {
    // Gathered on the GPU: one copy per request, queued on the instance's stream.
    if (next_device_buffer_ == device_buffers_->size()) {
      device_buffers_->emplace_back(device_alloc_);
    }
    BatchBuffer& buffer = (*device_buffers_)[next_device_buffer_++];
    char* data = buffer.Reserve(bytes);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(inferd::StrCat(
          "input '", cfg.name(), "': cannot allocate ", bytes, " bytes on GPU ", gpu_,
          " for the batch"));
    }
    size_t offset = 0;
    for (const auto* r : requests_) {
      const core::InputTensor* t = r->FindInput(cfg.name());
      if (!t->data.empty()) {
        if (absl::Status st = copy_(data + offset, t->data.data(), t->place, t->data.size());
            !st.ok()) {
          return absl::InternalError(inferd::StrCat("input '", cfg.name(), "': gathering on GPU ",
                                                    gpu_, ": ", st.message()));
        }
      }
      offset += t->data.size();
    }
    batch.data = std::string_view(data, bytes);
    batch.place = MemoryPlace::Gpu(gpu_);
    return batch;
  }

  // One copy of each request's bytes into this instance's buffer, sized once and kept across
  // batches: no regrowth, and no fresh pages to fault in on every batch.
  // Pinned: from the runtime's allocator (a heap buffer left by an earlier host gather is
  // replaced), so its copy to the device can run asynchronously.
  if (next_buffer_ == buffers_->size()) buffers_->emplace_back();
  BatchBuffer& buffer = (*buffers_)[next_buffer_++];
  if (pinned && !buffer.allocator_backed()) buffer = BatchBuffer(pinned_);
  char* data = buffer.Reserve(bytes);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(inferd::StrCat(
        "input '", cfg.name(), "': cannot allocate ", bytes,
        " bytes of pinned host memory for the batch"));
  }
  size_t offset = 0;
  for (const auto* r : requests_) {
    const std::string_view piece = r->FindInput(cfg.name())->data;
    if (!piece.empty()) std::memcpy(data + offset, piece.data(), piece.size());
    offset += piece.size();
  }
  batch.data = std::string_view(data, bytes);
  return batch;
}

BatchOutputResponder::BatchOutputResponder(std::span<core::InferRequest* const> requests,
                                           std::span<core::InferResponse* const> responses,
                                           bool batching)
    : requests_(requests), responses_(responses), batching_(batching) {
  for (const auto* r : requests_) total_batch_ += r->batch_size;
}

bool BatchOutputResponder::AnyRequested(std::string_view name) const {
  for (const auto* r : requests_) {
    if (IsOutputRequested(*r, name)) return true;
  }
  return false;
}

Shape BatchOutputResponder::ClientShape(const inference::ModelOutput* cfg,
                                        const Shape& runtime_shape, int64_t batch) const {
  if (cfg == nullptr || !cfg->has_reshape()) return runtime_shape;
  Shape shape;
  if (batching_) shape.push_back(batch);
  for (int64_t d : cfg->dims()) {
    if (d < 0) return runtime_shape;  // cannot resolve a variable dim: keep the runtime's
    shape.push_back(d);
  }
  return shape;
}

absl::Status BatchOutputResponder::Respond(const inference::ModelOutput* cfg,
                                           std::string_view name, DataType datatype,
                                           const Shape& shape, std::string_view data,
                                           std::shared_ptr<const void> holder,
                                           MemoryPlacement source) {
  // Host memory, pinned or not, and GPU memory are sliced the same way (offsets only); the
  // slices carry the GPU place.
  const bool gpu = source.kind == MemoryPlacement::Kind::kGpu;
  if (gpu && datatype == DataType::kBytes) {
    return absl::InternalError(inferd::StrCat(
        "output '", name, "': a BYTES output must be in host memory, not on GPU ",
        source.device_id));
  }
  const MemoryPlace place = gpu ? MemoryPlace::Gpu(source.device_id) : MemoryPlace::Host();
  const size_t n = requests_.size();
  if (n == 1) {
    if (IsOutputRequested(*requests_[0], name)) {
      core::OutputTensor& out = responses_[0]->outputs.emplace_back();
      out.name = std::string(name);
      out.datatype = datatype;
      out.shape = ClientShape(cfg, shape, requests_[0]->batch_size);
      out.data = data;
      out.holder = std::move(holder);
      out.place = place;
    }
    return absl::OkStatus();
  }
  if (shape.empty() || shape[0] != total_batch_) {
    return absl::InternalError(inferd::StrCat(
        "output '", name, "' cannot be split by batch: its shape ", ShapeToString(shape),
        " does not start with the batch's ", total_batch_, " rows"));
  }
  auto count = ElementCount(shape);
  if (!count.ok()) {
    return absl::InternalError(
        inferd::StrCat("output '", name, "': ", count.status().message()));
  }
  // BYTES: where each element starts, so a request's rows end at an element boundary.
  std::vector<size_t> offsets;
  if (datatype == DataType::kBytes) {
    auto found = BytesElementOffsets(data);
    if (!found.ok()) {
      return absl::InternalError(
          inferd::StrCat("output '", name, "': ", found.status().message()));
    }
    offsets = *std::move(found);
    if (offsets.size() - 1 != static_cast<size_t>(*count)) {
      return absl::InternalError(inferd::StrCat("output '", name, "' has shape ",
                                                ShapeToString(shape), " but ",
                                                offsets.size() - 1, " BYTES elements"));
    }
  } else if (data.size() != static_cast<uint64_t>(*count) * DataTypeSize(datatype)) {
    return absl::InternalError(inferd::StrCat("output '", name, "' has shape ",
                                              ShapeToString(shape), " but ", data.size(),
                                              " bytes of ", DataTypeName(datatype)));
  }
  const size_t per_row = total_batch_ <= 0 ? 0 : static_cast<size_t>(*count) / total_batch_;
  size_t element = 0;  // the first element of request r
  for (size_t r = 0; r < n; ++r) {
    const int64_t rows = requests_[r]->batch_size;
    const size_t next = element + per_row * rows;
    if (IsOutputRequested(*requests_[r], name)) {
      std::string_view slice;
      if (datatype == DataType::kBytes) {
        slice = data.substr(offsets[element], offsets[next] - offsets[element]);
      } else {
        const size_t size = DataTypeSize(datatype);
        slice = data.substr(element * size, (next - element) * size);
      }
      Shape request_shape = shape;
      request_shape[0] = rows;
      core::OutputTensor& out = responses_[r]->outputs.emplace_back();
      out.name = std::string(name);
      out.datatype = datatype;
      out.shape = ClientShape(cfg, request_shape, rows);
      out.data = slice;
      out.holder = holder;
      out.place = place;
    }
    element = next;
  }
  return absl::OkStatus();
}

void AddRequestedOutputs(const core::InferRequest& request,
                         std::vector<core::OutputTensor> outputs, core::InferResponse* response) {
  for (auto& t : outputs) {
    if (IsOutputRequested(request, t.name)) response->outputs.push_back(std::move(t));
  }
}

void AppendBytesElement(std::string_view element, std::string* buffer) {
  const uint32_t len = static_cast<uint32_t>(element.size());
  char prefix[4];
  std::memcpy(prefix, &len, 4);  // little-endian hosts only, as the rest of the server
  buffer->append(prefix, 4);
  buffer->append(element);
}

absl::StatusOr<size_t> CountBytesElements(std::string_view buffer) {
  size_t count = 0;
  auto st = ForEachBytesElement(buffer, [&](std::string_view) { ++count; });
  if (!st.ok()) return st;
  return count;
}

absl::StatusOr<std::vector<size_t>> BytesElementOffsets(std::string_view buffer) {
  std::vector<size_t> offsets;
  auto st = ForEachBytesElement(buffer, [&](std::string_view e) {
    offsets.push_back(static_cast<size_t>(e.data() - buffer.data()) - 4);
  });
  if (!st.ok()) return st;
  offsets.push_back(buffer.size());
  return offsets;
}

}  // namespace inferd::backends
