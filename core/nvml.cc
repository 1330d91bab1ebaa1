#include "core/nvml.h"

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace mg::nvml {
namespace {

// The slice of NVML's C ABI used here (nvml.h is not part of every toolkit install).
using Device = void*;
using Ret = int;
constexpr Ret kSuccess = 0;
constexpr Ret kInsufficientSize = 7;
struct Memory {
  unsigned long long total, free, used;
};
struct Utilization {
  unsigned int gpu, memory;
};
struct ProcessInfo {  // nvmlProcessInfo_t as taken by nvmlDeviceGetComputeRunningProcesses_v3
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
};

struct Api {
  void* lib = nullptr;
  std::string error;
  Ret (*init)() = nullptr;
  const char* (*error_string)(Ret) = nullptr;
  Ret (*count)(unsigned int*) = nullptr;
  Ret (*handle)(unsigned int, Device*) = nullptr;
  Ret (*name)(Device, char*, unsigned int) = nullptr;
  Ret (*memory)(Device, Memory*) = nullptr;
  Ret (*utilization)(Device, Utilization*) = nullptr;
  Ret (*temperature)(Device, int, unsigned int*) = nullptr;
  Ret (*power)(Device, unsigned int*) = nullptr;
  Ret (*processes)(Device, unsigned int*, ProcessInfo*) = nullptr;
};

template <class F>
bool load(void* lib, const char* sym, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, sym));
  return *out != nullptr;
}

const Api& api() {
  static const Api a = [] {
    Api r;
    r.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!r.lib) {
      const char* e = dlerror();
      r.error = e ? e : "libnvidia-ml.so.1 not found";
      return r;
    }
    const bool ok =
        load(r.lib, "nvmlInit_v2", &r.init) && load(r.lib, "nvmlErrorString", &r.error_string) &&
        load(r.lib, "nvmlDeviceGetCount_v2", &r.count) && load(r.lib, "nvmlDeviceGetHandleByIndex_v2", &r.handle) &&
        load(r.lib, "nvmlDeviceGetName", &r.name) && load(r.lib, "nvmlDeviceGetMemoryInfo", &r.memory) &&
        load(r.lib, "nvmlDeviceGetUtilizationRates", &r.utilization) &&
        load(r.lib, "nvmlDeviceGetTemperature", &r.temperature) && load(r.lib, "nvmlDeviceGetPowerUsage", &r.power) &&
        load(r.lib, "nvmlDeviceGetComputeRunningProcesses_v3", &r.processes);
    if (!ok) {
      r.error = "libnvidia-ml.so.1 lacks an expected symbol (driver too old?)";
      r.lib = nullptr;
      return r;
    }
    if (Ret e = r.init(); e != kSuccess) {
      r.error = std::string("nvmlInit failed: ") + r.error_string(e);
      r.lib = nullptr;
    }
    return r;
  }();
  return a;
}

const Api& checked(const char* op) {
  const Api& a = api();
  MG_CHECK(a.lib, DeviceError, op, ": NVML is not available (", a.error, ")");
  return a;
}

}  // namespace

bool available() { return api().lib != nullptr; }
std::string unavailable_reason() { return api().error; }

int device_count() {
  const Api& a = checked("nvml::device_count");
  unsigned int n = 0;
  Ret e = a.count(&n);
  MG_CHECK(e == kSuccess, DeviceError, "nvml::device_count: ", a.error_string(e));
  return static_cast<int>(n);
}

DeviceStatus status(int index) {
  const Api& a = checked("nvml::status");
  const int n = device_count();
  MG_CHECK(index >= 0 && index < n, DeviceError, "nvml::status: device ", index, " out of range (", n, " devices)");
  Device d = nullptr;
  Ret e = a.handle(static_cast<unsigned int>(index), &d);
  MG_CHECK(e == kSuccess, DeviceError, "nvml::status: device ", index, ": ", a.error_string(e));
  DeviceStatus s;
  s.index = index;
  char name[96] = {0};
  if (a.name(d, name, sizeof name) == kSuccess) s.name = name;
  Memory m{};
  e = a.memory(d, &m);
  MG_CHECK(e == kSuccess, DeviceError, "nvml::status: memory info of device ", index, ": ", a.error_string(e));
  s.total_bytes = m.total, s.free_bytes = m.free, s.used_bytes = m.used;
  // Optional readings: virtual machines and MIG slices often do not report them.
  if (Utilization u{}; a.utilization(d, &u) == kSuccess) s.gpu_util_percent = u.gpu, s.memory_util_percent = u.memory;
  if (unsigned int t = 0; a.temperature(d, /*NVML_TEMPERATURE_GPU*/ 0, &t) == kSuccess) s.temperature_c = t;
  if (unsigned int mw = 0; a.power(d, &mw) == kSuccess) s.power_watts = mw / 1000.0;
  unsigned int count = 0;
  e = a.processes(d, &count, nullptr);
  if (e == kSuccess || e == kInsufficientSize) {
    std::vector<ProcessInfo> p(count + 8);
    count = static_cast<unsigned int>(p.size());
    if (a.processes(d, &count, p.data()) == kSuccess)
      for (unsigned int i = 0; i < count; ++i) s.processes.push_back({p[i].pid, p[i].used});
  }
  return s;
}

std::string format(const DeviceStatus& s) {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, "%s: %.2f / %.2f GiB used (%zu processes)", s.name.c_str(),
                        s.used_bytes / 1073741824.0, s.total_bytes / 1073741824.0, s.processes.size());
  std::string out(buf, n);
  if (s.gpu_util_percent) out += ", GPU " + std::to_string(*s.gpu_util_percent) + "%";
  if (s.temperature_c) out += ", " + std::to_string(*s.temperature_c) + " C";
  if (s.power_watts) out += ", " + std::to_string(static_cast<int>(std::lround(*s.power_watts))) + " W";
  return out;
}

Monitor::Monitor(int index, int interval_ms) : index_(index), interval_ms_(interval_ms) {
  MG_CHECK(interval_ms > 0, ValueError, "nvml::Monitor: interval_ms must be positive, got ", interval_ms);
  checked("nvml::Monitor");
  const int n = device_count();
  MG_CHECK(index >= 0 && index < n, DeviceError, "nvml::Monitor: device ", index, " out of range (", n, " devices)");
}

Monitor::~Monitor() { stop(); }

void Monitor::start() {
  if (running_.exchange(true)) return;
  thread_ = std::thread([this] { loop(); });
}

void Monitor::stop() {
  if (!running_.exchange(false)) return;
  thread_.join();
}

void Monitor::loop() {
  while (running_.load()) {
    const DeviceStatus s = status(index_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++samples_;
      peak_used_ = std::max<uint64_t>(peak_used_, s.used_bytes);
      if (s.gpu_util_percent) util_sum_ += *s.gpu_util_percent, ++util_samples_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms_));
  }
}

int64_t Monitor::samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}
uint64_t Monitor::peak_used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_used_;
}
double Monitor::mean_gpu_util_percent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return util_samples_ ? util_sum_ / util_samples_ : std::nan("");
}

}  // namespace mg::nvml
