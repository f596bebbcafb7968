#include "backends/image/image_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "backends/image_codec/image_decode.h"
#include "backends/image/image_transform.h"
#include "backends/tensor_places.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "gpu/image_preprocess_kernel.h"

namespace inferd::backends {
namespace {

using image::PreprocessSettings;

// Runs fn(0..n-1) on up to `threads` threads (this one included). fn must not throw.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto drain = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> helpers;
  const size_t wanted = std::min<size_t>(n, std::max(threads, 1)) - (n > 0 ? 1 : 0);
  for (size_t k = 0; k < wanted; ++k) {
    try {
      helpers.emplace_back(drain);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones we have (and this one) take the rest
    }
  }
  drain();
  for (auto& t : helpers) t.join();
}

// One batch item: the encoded bytes and where its pixels go.
struct Item {
  size_t request = 0;
  int64_t index = 0;  // within its request
  std::string_view bytes;
  void* out = nullptr;  // CPU instances: where the item's output goes
  absl::Status status;
  image::RgbImage decoded;  // GPU instances: the decoded pixels, until uploaded
};

// A GPU instance's device state: its stream and the buffers it reuses from batch to batch
// (grown, never shrunk, so a steady load allocates nothing per batch but the output when it
// stays on the GPU). Used only by the instance's thread.
struct GpuState {
  gpu::Runtime* runtime = nullptr;
  int device = 0;
  ImagePreprocessLauncher launch;
  std::unique_ptr<gpu::Stream> stream;
  std::unique_ptr<gpu::PinnedBuffer> pixels_staging;  // the batch's decoded pixels, packed
  std::unique_ptr<gpu::DeviceBuffer> pixels;          // the same on the GPU
  std::unique_ptr<gpu::DeviceBuffer> output;          // the batch's output, when copied back
  std::unique_ptr<gpu::PinnedBuffer> output_staging;  // where it is copied back to
};

// Grows `buffer` to at least `bytes` (with room for a quarter more, so slowly growing batches
// do not reallocate each time). Contents are not kept.
template <typename Buffer, typename Allocate>
absl::Status Reserve(std::unique_ptr<Buffer>* buffer, size_t bytes, Allocate allocate) {
  if (*buffer != nullptr && (*buffer)->size() >= bytes) return absl::OkStatus();
  buffer->reset();  // free the old one first: device memory may not hold both
  auto fresh = allocate(bytes + bytes / 4);
  if (!fresh.ok()) return fresh.status();
  *buffer = *std::move(fresh);
  return absl::OkStatus();
}

// One instance of an image model. Execute runs on one thread at a time (the scheduler's
// instance thread) and starts up to threads_ - 1 helpers for the batch, joined before it
// returns; settings are read-only after construction. Each response's output buffer is owned
// by its holder, so it outlives the instance if the response does (on a GPU too: the device
// buffer frees itself through the runtime, which outlives every model).
class ImageInstance : public ModelInstance {
 public:
  // `gpu` null: a CPU instance.
  ImageInstance(const config::ModelConfig* config, PreprocessSettings settings, int threads,
                std::unique_ptr<GpuState> gpu)
      : config_(config), settings_(std::move(settings)), threads_(threads), gpu_(std::move(gpu)) {
    Shape item = image::ItemShape(settings_);
    item_elements_ = static_cast<size_t>(item[0] * item[1] * item[2]);
  }

  int ThreadCount() const override { return threads_; }

  // With `output_on_gpu` the output stays on the GPU for every request, and the server copies it
  // to the host for consumers that read host bytes; without it, only for a batch of ensemble
  // steps whose next step takes GPU inputs (InferRequest::gpu_outputs_ok), as ONNX Runtime's.
  bool OutputsMayBeOnGpu() const override { return gpu_ != nullptr && settings_.output_on_gpu; }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    times->input_end_ns = core::NowNs();
    FailBatchOnException("image backend", responses, [&] { Run(requests, responses); });
    times->output_start_ns = core::NowNs();
  }

 private:
  // Splits a request's input into its images: rows of a [B, L] UINT8 tensor (or the one row of
  // an [L] tensor when the model does not batch), or the elements of a BYTES tensor.
  absl::Status SplitImages(const core::InputTensor& in, std::vector<std::string_view>* images) {
    const bool batching = config_->max_batch_size() > 0;
    if (in.datatype == DataType::kBytes) {
      return ForEachBytesElement(in.data, [&](std::string_view e) { images->push_back(e); });
    }
    if (!batching) {
      images->push_back(in.data);
      return absl::OkStatus();
    }
    if (in.shape.size() != 2 || in.shape[0] < 0 || in.shape[1] < 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", in.name, "' must have shape [batch, bytes], got ", ShapeToString(in.shape)));
    }
    const size_t row = static_cast<size_t>(in.shape[1]);
    for (int64_t i = 0; i < in.shape[0]; ++i) images->push_back(in.data.substr(i * row, row));
    return absl::OkStatus();
  }

  size_t ItemBytes() const { return item_elements_ * DataTypeSize(settings_.output_type); }

  // The batch's items, request by request (a request's items are consecutive); a request that
  // cannot run gets its error and no items. image_counts[r]: request r's images (0: no output).
  std::vector<Item> CollectItems(std::span<core::InferRequest* const> requests,
                                 std::span<core::InferResponse* const> responses,
                                 std::vector<size_t>* image_counts) {
    const auto& out_cfg = config_->output(0);
    const bool batching = config_->max_batch_size() > 0;
    image_counts->assign(requests.size(), 0);
    std::vector<Item> items;
    for (size_t r = 0; r < requests.size(); ++r) {
      const core::InferRequest& req = *requests[r];
      if (!IsOutputRequested(req, out_cfg.name())) continue;
      const core::InputTensor* in = req.FindInput(config_->input(0).name());
      if (in == nullptr) {
        responses[r]->status = absl::InvalidArgumentError(
            inferd::StrCat("input '", config_->input(0).name(), "' is missing"));
        continue;
      }
      std::vector<std::string_view> images;
      if (auto st = SplitImages(*in, &images); !st.ok()) {
        responses[r]->status = st;
        continue;
      }
      if (!batching && images.size() != 1) {
        responses[r]->status = absl::InvalidArgumentError(inferd::StrCat(
            "input '", in->name, "' must hold exactly one image, got ", images.size()));
        continue;
      }
      (*image_counts)[r] = images.size();
      for (size_t i = 0; i < images.size(); ++i) {
        items.push_back(Item{r, static_cast<int64_t>(i), images[i], nullptr, absl::OkStatus(), {}});
      }
    }
    return items;
  }

  // A request fails with its first failing image (its count becomes 0: no output).
  static void FailRequestsOfBadItems(const std::vector<Item>& items,
                                     std::span<core::InferResponse* const> responses,
                                     std::vector<size_t>* image_counts) {
    for (const Item& item : items) {
      if (!item.status.ok() && (*image_counts)[item.request] != 0) {
        (*image_counts)[item.request] = 0;
        responses[item.request]->status = item.status;
      }
    }
  }

  // The response tensor of request r's `count` items at `data` (at `place`), kept by `holder`.
  core::OutputTensor MakeOutput(size_t count, std::string_view data,
                                std::shared_ptr<const void> holder, MemoryPlace place) const {
    core::OutputTensor out;
    out.name = config_->output(0).name();
    out.datatype = settings_.output_type;
    out.shape = image::ItemShape(settings_);
    if (config_->max_batch_size() > 0) out.shape.insert(out.shape.begin(), static_cast<int64_t>(count));
    out.data = data;
    out.holder = std::move(holder);
    out.place = place;
    return out;
  }

  void Run(std::span<core::InferRequest* const> requests,
           std::span<core::InferResponse* const> responses) {
    if (gpu_ != nullptr) {
      RunOnGpu(requests, responses);
      return;
    }
    std::vector<size_t> image_counts;
    std::vector<Item> items = CollectItems(requests, responses, &image_counts);
    // Per request: its output buffer (also the holder of the response tensor). A float vector
    // keeps FP32 outputs aligned; UINT8 outputs use its bytes.
    std::vector<std::shared_ptr<std::vector<float>>> buffers(requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
      if (image_counts[r] == 0) continue;
      const size_t bytes = image_counts[r] * ItemBytes();
      buffers[r] = std::make_shared<std::vector<float>>((bytes + sizeof(float) - 1) / sizeof(float));
    }
    for (Item& item : items) {
      item.out = reinterpret_cast<char*>(buffers[item.request]->data()) + item.index * ItemBytes();
    }

    ParallelFor(items.size(), threads_, [&](size_t k) { Process(&items[k]); });

    FailRequestsOfBadItems(items, responses, &image_counts);
    for (size_t r = 0; r < requests.size(); ++r) {
      if (image_counts[r] == 0) continue;
      std::string_view data(reinterpret_cast<const char*>(buffers[r]->data()),
                            image_counts[r] * ItemBytes());
      responses[r]->outputs.push_back(
          MakeOutput(image_counts[r], data, std::move(buffers[r]), MemoryPlace::Host()));
    }
  }

  // Decodes on the CPU (in parallel, as a CPU instance), then on the instance's stream: one
  // host-to-device copy of every decoded image of the batch, one kernel launch per image into
  // one output buffer for the batch, and (unless the output stays on the GPU) one
  // device-to-host copy of it; one Synchronize before answering, so the response's bytes are
  // final and no copy still reads a staging buffer the next batch reuses.
  void RunOnGpu(std::span<core::InferRequest* const> requests,
                std::span<core::InferResponse* const> responses) {
    // The output stays on the GPU when the config says so, or when every request's consumer
    // reads it there: an ensemble step whose next step takes it, or a CUDA shared-memory
    // region on this GPU (tensor_places.h: one device-to-device copy into it at the edge).
    const bool keep =
        settings_.output_on_gpu ||
        BatchOutputMayStayOnGpu(requests, config_->output(0).name(), gpu_->device);
    std::vector<size_t> image_counts;
    std::vector<Item> items = CollectItems(requests, responses, &image_counts);
    ParallelFor(items.size(), threads_, [&](size_t k) { Decode(&items[k]); });
    FailRequestsOfBadItems(items, responses, &image_counts);

    // Where each answered request's output and each of its items' pixels lie in the batch.
    std::vector<size_t> output_offset(requests.size(), 0);
    size_t output_bytes = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      output_offset[r] = output_bytes;
      output_bytes += image_counts[r] * ItemBytes();
    }
    if (output_bytes == 0) return;  // every request failed or asked for nothing
    std::vector<size_t> pixel_offset(items.size(), 0);
    size_t pixel_bytes = 0;
    for (size_t k = 0; k < items.size(); ++k) {
      if (image_counts[items[k].request] == 0) continue;
      pixel_offset[k] = pixel_bytes;
      pixel_bytes += items[k].decoded.pixels.size();
    }

    std::shared_ptr<gpu::DeviceBuffer> kept_output;  // output_on_gpu: the responses' buffer
    const absl::Status status = [&]() -> absl::Status {
      try {
        return QueueOnStream(items, image_counts, output_offset, output_bytes, pixel_offset,
                             pixel_bytes, keep, &kept_output);
      } catch (...) {
        // Wait for what was queued before the exception leaves (FailBatchOnException answers
        // it): nothing may still use a staging buffer once Execute returns.
        (void)gpu_->stream->Synchronize();
        throw;
      }
    }();

    if (!status.ok()) {
      // Nothing queued may still read or write a buffer once this returns (the next batch
      // reuses them); the requests that were to be answered get the device's error.
      (void)gpu_->stream->Synchronize();
      const absl::Status failed(
          status.code(), inferd::StrCat("image backend on GPU ", gpu_->device, ": ",
                                        status.message()));
      for (size_t r = 0; r < requests.size(); ++r) {
        if (image_counts[r] != 0) responses[r]->status = failed;
      }
      return;
    }
    for (size_t r = 0; r < requests.size(); ++r) {
      if (image_counts[r] == 0) continue;
      const size_t bytes = image_counts[r] * ItemBytes();
      if (keep) {
        std::string_view data(static_cast<const char*>(kept_output->data()) + output_offset[r],
                              bytes);
        responses[r]->outputs.push_back(
            MakeOutput(image_counts[r], data, kept_output, MemoryPlace::Gpu(gpu_->device)));
        continue;
      }
      // The staging buffer is the next batch's: each response gets its own host copy (a
      // float vector keeps FP32 aligned).
      auto host = std::make_shared<std::vector<float>>((bytes + sizeof(float) - 1) / sizeof(float));
      std::memcpy(host->data(), static_cast<const char*>(gpu_->output_staging->data()) +
                                    output_offset[r], bytes);
      std::string_view data(reinterpret_cast<const char*>(host->data()), bytes);
      responses[r]->outputs.push_back(
          MakeOutput(image_counts[r], data, std::move(host), MemoryPlace::Host()));
    }
  }

  // RunOnGpu's device part: stages and uploads the pixels, queues the kernels and the copy
  // back, and waits for the stream. With `keep`, `kept_output` gets the batch's output buffer,
  // which stays on the GPU.
  absl::Status QueueOnStream(const std::vector<Item>& items,
                             const std::vector<size_t>& image_counts,
                             const std::vector<size_t>& output_offset, size_t output_bytes,
                             const std::vector<size_t>& pixel_offset, size_t pixel_bytes,
                             bool keep, std::shared_ptr<gpu::DeviceBuffer>* kept) {
    std::shared_ptr<gpu::DeviceBuffer>& kept_output = *kept;
    gpu::Runtime& rt = *gpu_->runtime;
    gpu::Stream& stream = *gpu_->stream;
    RETURN_IF_ERROR(Reserve(&gpu_->pixels_staging, pixel_bytes,
                            [&](size_t n) { return rt.AllocatePinned(n); }));
    RETURN_IF_ERROR(Reserve(&gpu_->pixels, pixel_bytes,
                            [&](size_t n) { return rt.AllocateDevice(gpu_->device, n); }));
    char* staging = static_cast<char*>(gpu_->pixels_staging->data());
    for (size_t k = 0; k < items.size(); ++k) {
      if (image_counts[items[k].request] == 0) continue;
      std::memcpy(staging + pixel_offset[k], items[k].decoded.pixels.data(),
                  items[k].decoded.pixels.size());
    }
    RETURN_IF_ERROR(rt.CopyAsync(gpu_->pixels->data(), staging, pixel_bytes,
                                 gpu::CopyKind::kHostToDevice, stream));
    char* device_out;
    if (keep) {
      auto fresh = rt.AllocateDevice(gpu_->device, output_bytes);
      if (!fresh.ok()) return fresh.status();
      kept_output = *std::move(fresh);
      device_out = static_cast<char*>(kept_output->data());
    } else {
      RETURN_IF_ERROR(Reserve(&gpu_->output, output_bytes,
                              [&](size_t n) { return rt.AllocateDevice(gpu_->device, n); }));
      device_out = static_cast<char*>(gpu_->output->data());
    }
    const auto* device_pixels = static_cast<const uint8_t*>(gpu_->pixels->data());
    for (size_t k = 0; k < items.size(); ++k) {
      const Item& item = items[k];
      if (image_counts[item.request] == 0) continue;
      const auto params =
          image::MathParamsFor(item.decoded.width, item.decoded.height, settings_);
      RETURN_IF_ERROR(gpu_->launch(device_pixels + pixel_offset[k], params,
                                   device_out + output_offset[item.request] +
                                       static_cast<size_t>(item.index) * ItemBytes(),
                                   stream));
    }
    if (!keep) {
      RETURN_IF_ERROR(Reserve(&gpu_->output_staging, output_bytes,
                              [&](size_t n) { return rt.AllocatePinned(n); }));
      RETURN_IF_ERROR(rt.CopyAsync(gpu_->output_staging->data(), device_out, output_bytes,
                                   gpu::CopyKind::kDeviceToHost, stream));
    }
    return stream.Synchronize();
  }

  // Decodes item->bytes into item->decoded, or sets item->status ("image <i>: ...").
  void Decode(Item* item) const {
    try {
      auto decoded = image::DecodeImage(item->bytes, settings_.max_pixels);
      if (!decoded.ok()) {
        item->status = absl::Status(decoded.status().code(),
                                    inferd::StrCat("image ", item->index, ": ",
                                                   decoded.status().message()));
        return;
      }
      item->decoded = *std::move(decoded);
    } catch (const std::bad_alloc&) {
      item->status = absl::ResourceExhaustedError(
          inferd::StrCat("image ", item->index, ": out of memory"));
    } catch (const std::exception& e) {
      item->status = absl::InternalError(inferd::StrCat("image ", item->index, ": ", e.what()));
    }
  }

  // CPU instances: decodes and preprocesses into item->out; the pixels are dropped at once.
  void Process(Item* item) const {
    Decode(item);
    if (!item->status.ok()) return;
    try {
      image::Preprocess(item->decoded, settings_, item->out);
    } catch (const std::exception& e) {
      item->status = absl::InternalError(inferd::StrCat("image ", item->index, ": ", e.what()));
    }
    item->decoded = image::RgbImage();
  }

  const config::ModelConfig* config_;
  const PreprocessSettings settings_;
  const int threads_;
  const std::unique_ptr<GpuState> gpu_;
  size_t item_elements_ = 0;
};

class ImageBackend : public Backend {
 public:
  explicit ImageBackend(ImageBackendOptions options) : options_(std::move(options)) {}

  std::string_view name() const override { return "image"; }
  // Each request's images are decoded on their own, so encoded inputs of different lengths
  // can share a batch.
  bool SupportsRaggedBatch() const override { return true; }

  // GPU instances need the kernel in the build; whether the host has a GPU is placement's
  // question (it refuses KIND_GPU there, or --gpu-fallback-to-cpu runs it on the CPU).
  absl::Status GpuInstanceSupport() const override {
    if (!options_.launch && !gpu::ImagePreprocessKernelBuilt()) {
      return absl::FailedPreconditionError(
          "backend 'image' cannot run on a GPU: this build has no CUDA, so no preprocessing "
          "kernel (configure with -DINFERD_WITH_CUDA=ON where the CUDA toolkit is installed)");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstanceOn(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const InstanceDevice& device) override {
    if (!device.gpu) return CreateInstance(spec, group, index);
    const std::string where = inferd::StrCat("model '", spec.config->name(), "': instance '",
                                             device.name, "' on GPU ", device.id, ": ");
    if (absl::Status st = GpuInstanceSupport(); !st.ok()) {
      return absl::FailedPreconditionError(inferd::StrCat(where, st.message()));
    }
    gpu::Runtime& runtime = Runtime();
    if (device.id < 0 || device.id >= runtime.DeviceCount()) {
      return absl::FailedPreconditionError(inferd::StrCat(
          where, "the GPU runtime lists ", runtime.DeviceCount(), " GPU(s)",
          runtime.DeviceCount() == 0 ? inferd::StrCat(" (", runtime.UnavailableReason(), ")")
                                     : std::string()));
    }
    auto settings = Settings(spec, index);
    if (!settings.ok()) return settings.status();
    auto state = std::make_unique<GpuState>();
    state->runtime = &runtime;
    state->device = device.id;
    state->launch = options_.launch ? options_.launch : gpu::LaunchImagePreprocess;
    auto stream = runtime.CreateStream(device.id);
    if (!stream.ok()) {
      return absl::Status(stream.status().code(),
                          inferd::StrCat(where, stream.status().message()));
    }
    state->stream = *std::move(stream);
    return std::make_unique<ImageInstance>(spec.config, *std::move(settings), Threads(spec),
                                           std::move(state));
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    auto settings = Settings(spec, index);
    if (!settings.ok()) return settings.status();
    return std::make_unique<ImageInstance>(spec.config, *std::move(settings), Threads(spec),
                                           nullptr);
  }

 private:
  gpu::Runtime& Runtime() const {
    return options_.runtime != nullptr ? *options_.runtime : gpu::SystemRuntime();
  }

  static absl::StatusOr<PreprocessSettings> Settings(const ModelSpec& spec, int index) {
    // SettingsFromConfig refuses unknown parameters itself.
    ConfigSupport support;
    support.backend_checks_parameters = true;
    if (auto st = CheckConfigSupport(spec, "image", support, index); !st.ok()) return st;
    return image::SettingsFromConfig(*spec.config);
  }

  // Decoding is CPU work, on GPU instances too: the instances share the cores between them.
  static int Threads(const ModelSpec& spec) {
    return std::max(1, spec.cpu_cores / std::max(1, spec.total_instances));
  }

  const ImageBackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeImageBackend(ImageBackendOptions options) {
  return std::make_unique<ImageBackend>(std::move(options));
}

}  // namespace inferd::backends
