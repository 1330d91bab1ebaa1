// NVML monitoring: what the driver sees on each GPU (memory used by every process, not just
// ours; utilization, temperature, power), read through libnvidia-ml loaded at run time.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace mg::nvml {

struct ProcessMemory {
  uint32_t pid = 0;
  uint64_t used_bytes = 0;
};

struct DeviceStatus {
  int index = 0;  // NVML's index (physical order; CUDA's order when CUDA_VISIBLE_DEVICES is unset)
  std::string name;
  uint64_t total_bytes = 0, free_bytes = 0, used_bytes = 0;       // device-wide, all processes
  std::optional<uint32_t> gpu_util_percent, memory_util_percent;  // over the driver's last sample window
  std::optional<uint32_t> temperature_c;
  std::optional<double> power_watts;
  std::vector<ProcessMemory> processes;  // compute processes and their device memory
};

// True when libnvidia-ml.so.1 could be loaded and initialized (once, on first use).
bool available();
// Why not, when !available() (e.g. "libnvidia-ml.so.1: cannot open shared object file").
std::string unavailable_reason();
int device_count();
// Raises mg::DeviceError when NVML is unavailable or `index` is out of range.
DeviceStatus status(int index);
// A one-line summary: "NVIDIA H200: 12.3 / 139.8 GiB used (3 processes), GPU 97%, 61 C, 512 W".
std::string format(const DeviceStatus& s);

// Samples one device on a background thread every `interval_ms` (the seeds' pynvml loop):
// the peak of device-wide used memory and the mean GPU utilization over the run.
class Monitor {
 public:
  explicit Monitor(int index = 0, int interval_ms = 20);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  void start();
  void stop();
  int64_t samples() const;
  uint64_t peak_used_bytes() const;
  double mean_gpu_util_percent() const;  // NaN when the device does not report utilization

 private:
  void loop();
  int index_, interval_ms_;
  std::atomic<bool> running_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  int64_t samples_ = 0, util_samples_ = 0;
  uint64_t peak_used_ = 0;
  double util_sum_ = 0;
};

}  // namespace mg::nvml
