// NVML monitoring: without the driver library every call is a clear DeviceError; with it
// (the GPU machine) the readings are consistent and see our own allocations.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/device_runtime.h"
#include "core/nvml.h"
#include "core/tensor.h"

namespace mg {
namespace {

TEST(Nvml, UnavailableIsAClearError) {
  if (nvml::available()) GTEST_SKIP() << "NVML present: covered by the device tests";
  EXPECT_FALSE(nvml::unavailable_reason().empty());
  try {
    nvml::status(0);
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("NVML is not available"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nvml::Monitor m(0), DeviceError);
}

TEST(Nvml, ReadingsAndOurAllocationOnTheDevice) {
  if (!nvml::available() || !cuda::is_available()) GTEST_SKIP() << "needs NVML and a CUDA device";
  ASSERT_GE(nvml::device_count(), 1);
  EXPECT_THROW(nvml::status(nvml::device_count()), DeviceError);
  const nvml::DeviceStatus before = nvml::status(0);
  std::printf("[nvml] %s\n", nvml::format(before).c_str());
  EXPECT_FALSE(before.name.empty());
  EXPECT_GT(before.total_bytes, 0u);
  EXPECT_LE(before.used_bytes, before.total_bytes);
  EXPECT_LE(before.free_bytes, before.total_bytes);
  nvml::Monitor mon(0, 5);
  mon.start();
  // 2 GiB through the caching allocator (one segment): the driver must see it.
  Tensor t = empty({int64_t{1} << 29}, {DType::f32, Device::cuda(0)});
  raw::fill_(t, 1.0);
  cuda::synchronize();
  const nvml::DeviceStatus during = nvml::status(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  mon.stop();
  EXPECT_GE(during.used_bytes, before.used_bytes + (uint64_t{3} << 29)) << nvml::format(during);
  EXPECT_GE(mon.samples(), 2);
  EXPECT_GE(mon.peak_used_bytes(), during.used_bytes - (uint64_t{1} << 28));
}

}  // namespace
}  // namespace mg
