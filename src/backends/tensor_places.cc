#include "backends/tensor_places.h"

#include <memory>

#include "common/strings.h"
#include "gpu/copy.h"

namespace inferd::backends {

absl::Status PlaceInputsFor(gpu::Runtime* gpus, core::InferRequest* request,
                            std::optional<int> gpu_inputs_on) {
  for (auto& in : request->inputs) {
    if (in.place.OnHost()) continue;
    if (in.datatype != DataType::kBytes && TakesGpuInputOn(gpu_inputs_on, in.place.device_id)) {
      continue;  // the instances read it where it is
    }
    auto host = gpu::CopyToPlaceNow(gpus, in.data, in.place, MemoryPlace::Host());
    if (!host.ok()) {
      return absl::InternalError(inferd::StrCat("input '", in.name, "': copying from ",
                                                in.place.ToString(), " to the host: ",
                                                host.status().message()));
    }
    auto owned = std::make_shared<gpu::PlacedBuffer>(*std::move(host));
    in.data = owned->view();
    in.place = MemoryPlace::Host();
    request->holders.push_back(std::move(owned));
  }
  return absl::OkStatus();
}

bool MakeOutputsHostReadable(gpu::Runtime* gpus, core::InferResponse* response,
                             absl::FunctionRef<bool(const core::OutputTensor&)> keep_on_gpu) {
  if (!response->status.ok()) return true;
  for (auto& out : response->outputs) {
    if (out.place.OnHost() || keep_on_gpu(out)) continue;
    auto host = gpu::CopyToPlaceNow(gpus, out.data, out.place, MemoryPlace::Host());
    if (!host.ok()) {
      response->status = absl::InternalError(
          inferd::StrCat("output '", out.name, "': copying from ", out.place.ToString(),
                         " to the host: ", host.status().message()));
      response->outputs.clear();
      return false;
    }
    auto owned = std::make_shared<gpu::PlacedBuffer>(*std::move(host));
    out.data = owned->view();
    out.holder = std::move(owned);  // the GPU bytes go back with the old holder
    out.place = MemoryPlace::Host();
  }
  return true;
}

bool OutputMayStayOnGpu(const core::InferRequest& request, std::string_view name, int device) {
  if (request.gpu_outputs_ok || request.outputs.empty()) return request.gpu_outputs_ok;
  for (const auto& o : request.outputs) {
    if (o.name == name) return o.gpu_region_on.has_value() && *o.gpu_region_on == device;
  }
  return true;  // not asked for: never handed to this request
}

bool BatchOutputMayStayOnGpu(std::span<core::InferRequest* const> requests, std::string_view name,
                             int device) {
  if (requests.empty()) return false;
  for (const core::InferRequest* r : requests) {
    if (!OutputMayStayOnGpu(*r, name, device)) return false;
  }
  return true;
}

bool MakeOutputsHostReadable(gpu::Runtime* gpus, core::InferResponse* response) {
  return MakeOutputsHostReadable(gpus, response, [](const core::OutputTensor&) { return false; });
}

}  // namespace inferd::backends
