// The backend registry: the CPU backend is always here; the CUDA backend registers itself at
// start-up when //kernels/cuda is linked (alwayslink), so a CPU-only build simply has none.
#include "kernels/backend.h"

#include <array>

#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

constexpr size_t kDeviceTypes = 2;  // DeviceType::CPU, DeviceType::CUDA

std::array<Backend*, kDeviceTypes>& registry() {
  static CpuBackend cpu_backend;
  static std::array<Backend*, kDeviceTypes> r{&cpu_backend, nullptr};
  return r;
}

}  // namespace

bool register_backend(DeviceType type, Backend* b) {
  registry()[static_cast<size_t>(type)] = b;
  return true;
}

bool has_backend(Device device) { return registry()[static_cast<size_t>(device.type)] != nullptr; }

Backend& backend(Device device, const char* op) {
  Backend* b = registry()[static_cast<size_t>(device.type)];
  MG_CHECK(b, DeviceError, op, ": CUDA kernels not available in this build (tensor on ", device, ")");
  return *b;
}

}  // namespace mg::kernels
