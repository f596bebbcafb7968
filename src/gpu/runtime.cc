#include "gpu/runtime.h"

namespace inferd::gpu {

std::vector<DeviceProperties> ListDevices(const Runtime& runtime) {
  std::vector<DeviceProperties> devices;
  for (int i = 0; i < runtime.DeviceCount(); ++i) {
    auto props = runtime.Properties(i);
    if (props.ok()) devices.push_back(*std::move(props));
  }
  return devices;
}

}  // namespace inferd::gpu
