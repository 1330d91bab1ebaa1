// KernelProfiler: records every kernel, memcpy and memset on the GPU, and the host's CUDA runtime
// calls, through CUPTI's activity API between start() and stop(), then prints where a training
// step's device time goes and what the host did while the device waited.
//
// Linking this library (alwayslink) also gives mg::profiler its device side: profiler::start()
// starts trace_kernels() when a GPU is present, and profiler::stop() waits for the device and
// puts its records on the trace (core/profiler.h, DeviceTracer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mg::profiler {

struct KernelTotal {
  std::string name;  // demangled, template arguments elided
  int64_t calls = 0;
  double total_ms = 0;
};

// Device idle time between consecutive records (a kernel, copy or fill starting after every
// earlier one has ended), summed per pair of names around it.
struct IdleGap {
  std::string before, after;
  int64_t count = 0;
  double total_ms = 0, max_ms = 0;
};

// The copies and fills of one size after one kernel (the op that asked for them).
struct CopySite {
  std::string what;          // "[memcpy]" or "[memset]"
  std::string after_kernel;  // the nearest kernel before it, "(start)" when none
  uint64_t bytes = 0;
  int64_t count = 0;
  double total_ms = 0;
};

// A CUDA runtime function's calls on the host: count and time inside them.
struct ApiTotal {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0;
};

// One stretch of device idle time, the records around it, and the runtime calls the host
// started during it (what it was doing while the device waited; the rest is host code between
// calls).
struct IdleStretch {
  std::string before, after;
  uint64_t start_ns = 0, end_ns = 0;
  std::vector<ApiTotal> api;
  double api_ms = 0;
};

class KernelProfiler {
 public:
  // Enables CUPTI activity collection (kernels, memcpy, memset, the host's CUDA runtime calls;
  // with `link_driver_launches` the driver's calls too, so that add_to_trace links the kernels
  // cuBLAS and cuDNN launch through the driver to their op). Throws mg::Error if CUPTI cannot be
  // initialized.
  void start(bool link_driver_launches = false);
  // Flushes and stops; the records are kept for report().
  void stop();
  // Totals by kernel name, largest first.
  std::vector<KernelTotal> totals() const;
  // Sum of device busy time (union of intervals, so overlapping kernels count once), ms.
  double busy_ms() const;
  // The idle stretches, largest total first.
  std::vector<IdleGap> idle_gaps() const;
  // The host's CUDA runtime calls by function, costliest first.
  std::vector<ApiTotal> api_totals() const;
  // The n longest single idle stretches, longest first, with the runtime calls inside each.
  std::vector<IdleStretch> longest_idle(int n) const;
  // The copies and fills, most frequent first.
  std::vector<CopySite> copy_sites() const;
  // Puts the records on mg::profiler's trace (profiler::add_device_records): every kernel, copy
  // and fill on its device's stream track, linked to the op that launched it. Call after stop(),
  // with the trace recorded over the same stretch (profiler::start() before start()).
  void add_to_trace() const;
  // A table: top `top` kernels by time with calls and ms per step (divided by `steps`), the
  // rest summed, copies and fills, the device-busy fraction of `wall_ms_per_step`, and the
  // largest idle stretches by the kernels around them, the host's runtime calls (by function,
  // and inside the three longest idle stretches), and the most frequent copies and fills.
  std::string report(int steps, double wall_ms_per_step, int top = 25) const;
};

// The profiler that profiler::start() and stop() drive for the trace; after stop() its totals()
// are the trace's kernels as CUPTI's table counts them.
KernelProfiler& trace_kernels();

}  // namespace mg::profiler
