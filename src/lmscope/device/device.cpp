#include "lmscope/device/device.h"

#include "lmscope/core/allocator.h"

#include <fmt/format.h>

namespace lmscope {

std::string Device::name() const {
  return kind_ == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{} ({})", index_, facts_.name);
}

Device cpu_device() {
  DeviceFacts f;
  f.name = "cpu";
  f.memory_bytes = host_available_memory();
  return Device(DeviceKind::cpu, 0, std::move(f));
}

}  // namespace lmscope
