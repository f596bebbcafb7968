#include "backends/image/image_backend.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "backends/image_codec/image_decode.h"
#include "backends/image/image_transform.h"
#include "common/strings.h"

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
  void* out = nullptr;
  absl::Status status;
};

// One instance of an image model. Execute runs on one thread at a time (the scheduler's
// instance thread) and starts up to threads_ - 1 helpers for the batch, joined before it
// returns; settings are read-only after construction. Each response's output buffer is owned
// by its holder, so it outlives the instance if the response does.
class ImageInstance : public ModelInstance {
 public:
  ImageInstance(const config::ModelConfig* config, PreprocessSettings settings, int threads)
      : config_(config), settings_(std::move(settings)), threads_(threads) {
    Shape item = image::ItemShape(settings_);
    item_elements_ = static_cast<size_t>(item[0] * item[1] * item[2]);
  }

  int ThreadCount() const override { return threads_; }

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

  void Run(std::span<core::InferRequest* const> requests,
           std::span<core::InferResponse* const> responses) {
    const auto& out_cfg = config_->output(0);
    const size_t element_size = DataTypeSize(settings_.output_type);
    const bool batching = config_->max_batch_size() > 0;
    // Per request: its output buffer (also the holder of the response tensor).
    std::vector<std::shared_ptr<std::vector<float>>> buffers(requests.size());
    std::vector<size_t> image_counts(requests.size(), 0);
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
      // A float vector keeps FP32 outputs aligned; UINT8 outputs use its bytes.
      const size_t bytes = images.size() * item_elements_ * element_size;
      buffers[r] = std::make_shared<std::vector<float>>((bytes + sizeof(float) - 1) / sizeof(float));
      image_counts[r] = images.size();
      char* base = reinterpret_cast<char*>(buffers[r]->data());
      for (size_t i = 0; i < images.size(); ++i) {
        items.push_back(Item{r, static_cast<int64_t>(i), images[i],
                             base + i * item_elements_ * element_size, absl::OkStatus()});
      }
    }

    ParallelFor(items.size(), threads_, [&](size_t k) { Process(&items[k]); });

    // A request fails with its first failing image; its output buffer is dropped.
    std::vector<bool> failed(requests.size(), false);
    for (const Item& item : items) {
      if (!item.status.ok() && !failed[item.request]) {
        failed[item.request] = true;
        responses[item.request]->status = item.status;
      }
    }
    for (size_t r = 0; r < requests.size(); ++r) {
      if (failed[r] || buffers[r] == nullptr) continue;
      core::OutputTensor out;
      out.name = out_cfg.name();
      out.datatype = settings_.output_type;
      out.shape = image::ItemShape(settings_);
      if (batching) out.shape.insert(out.shape.begin(), static_cast<int64_t>(image_counts[r]));
      out.data = std::string_view(reinterpret_cast<const char*>(buffers[r]->data()),
                                  image_counts[r] * item_elements_ * element_size);
      out.holder = std::move(buffers[r]);
      responses[r]->outputs.push_back(std::move(out));
    }
  }

  void Process(Item* item) const {
    try {
      auto decoded = image::DecodeImage(item->bytes, settings_.max_pixels);
      if (!decoded.ok()) {
        item->status = absl::Status(decoded.status().code(),
                                    inferd::StrCat("image ", item->index, ": ",
                                                   decoded.status().message()));
        return;
      }
      image::Preprocess(*decoded, settings_, item->out);
    } catch (const std::bad_alloc&) {
      item->status = absl::ResourceExhaustedError(
          inferd::StrCat("image ", item->index, ": out of memory"));
    } catch (const std::exception& e) {
      item->status = absl::InternalError(inferd::StrCat("image ", item->index, ": ", e.what()));
    }
  }

  const config::ModelConfig* config_;
  const PreprocessSettings settings_;
  const int threads_;
  size_t item_elements_ = 0;
};

class ImageBackend : public Backend {
 public:
  std::string_view name() const override { return "image"; }
  // Each request's images are decoded on their own, so encoded inputs of different lengths
  // can share a batch.
  bool SupportsRaggedBatch() const override { return true; }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    // SettingsFromConfig refuses unknown parameters itself.
    if (auto st = CheckConfigSupport(spec, name(), {.backend_checks_parameters = true}, index);
        !st.ok()) {
      return st;
    }
    auto settings = image::SettingsFromConfig(*spec.config);
    if (!settings.ok()) return settings.status();
    // Decoding is CPU work: the instances share the cores between them.
    const int threads = std::max(1, spec.cpu_cores / std::max(1, spec.total_instances));
    return std::make_unique<ImageInstance>(spec.config, *std::move(settings), threads);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeImageBackend() { return std::make_unique<ImageBackend>(); }

}  // namespace inferd::backends
