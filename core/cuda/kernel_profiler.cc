#include "core/cuda/kernel_profiler.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/profiler.h"

namespace mg::profiler {
namespace {

struct Interval {
  uint64_t start, end;
  int kind;  // 0 kernel, 1 memcpy, 2 memset
  std::string name;
  uint64_t bytes = 0;  // copies and fills
  uint32_t device = 0, stream = 0, correlation = 0;
};

std::mutex g_mu;
std::vector<Interval> g_records;
// CUDA runtime calls on the host (CUPTI stamps them on the same clock as the device records).
struct ApiCall {
  uint64_t start, end;
  uint32_t cbid;
  uint32_t correlation = 0;
};
std::vector<ApiCall> g_api;
// One instant on both clocks, taken at start(): CUPTI's (ns) and the trace's (us).
// Driver calls that launched work (cuBLAS and cuDNN launch through the driver): correlation id
// and start, for linking their kernels to the op on the trace.
std::vector<std::pair<uint32_t, uint64_t>> g_driver_launches;
uint64_t g_cupti_t0 = 0;
double g_trace_t0 = 0;

std::string api_name(uint32_t cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) != CUPTI_SUCCESS || !name)
    return "runtime call " + std::to_string(cbid);
  std::string s = name;
  const size_t v = s.find("_v");  // "cudaLaunchKernel_v7000" -> "cudaLaunchKernel"
  return v == std::string::npos ? s : s.substr(0, v);
}

#define MG_CUPTI_CHECK(call)                                                       \
  do {                                                                             \
    CUptiResult r_ = (call);                                                       \
    if (r_ != CUPTI_SUCCESS) {                                                     \
      const char* s_ = nullptr;                                                    \
      cuptiGetResultString(r_, &s_);                                               \
      MG_THROW(CudaError, "kernel profiler: ", #call, " failed: ", s_ ? s_ : "?"); \
    }                                                                              \
  } while (0)

// "void mg::kernels::cuda::(anonymous namespace)::softmax_kernel<float, 4>(...)" ->
// "softmax_kernel<...>": enough to find the op, short enough for a table.
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : mangled;
  std::free(d);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  // Drop the argument list, then template arguments, then namespaces and return type.
  int depth = 0;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' && depth == 0) break;
    if (c == '<') {
      if (depth++ == 0) out += "<...>";
      continue;
    }
    if (c == '>') {
      --depth;
      continue;
    }
    if (depth == 0) out += c;
  }
  const size_t sp = out.rfind(' ');
  if (sp != std::string::npos) out = out.substr(sp + 1);
  const size_t ns = out.rfind("::");
  if (ns != std::string::npos) out = out.substr(ns + 2);
  return out;
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Interval> got;
  std::vector<ApiCall> api;
  std::vector<std::pair<uint32_t, uint64_t>> driver;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        got.push_back({k->start, k->end, 0, short_name(k->name), 0, k->deviceId, k->streamId, k->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        got.push_back({m->start, m->end, 1, "[memcpy]", m->bytes, m->deviceId, m->streamId, m->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        got.push_back({m->start, m->end, 2, "[memset]", m->bytes, m->deviceId, m->streamId, m->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        driver.emplace_back(static_cast<uint32_t>(a->correlationId), static_cast<uint64_t>(a->start));
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        api.push_back({a->start, a->end, a->cbid, a->correlationId});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records.insert(g_records.end(), got.begin(), got.end());
  g_api.insert(g_api.end(), api.begin(), api.end());
  g_driver_launches.insert(g_driver_launches.end(), driver.begin(), driver.end());
}

}  // namespace

void KernelProfiler::start(bool link_driver_launches) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_records.clear();
    g_api.clear();
    g_driver_launches.clear();
  }
  MG_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  MG_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  MG_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  if (link_driver_launches) MG_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
  MG_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  MG_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  MG_CUPTI_CHECK(cuptiGetTimestamp(&g_cupti_t0));
  g_trace_t0 = profiler::now_us();
}

void KernelProfiler::add_to_trace() const {
  auto us = [](uint64_t ns) { return g_trace_t0 + (static_cast<double>(ns) - static_cast<double>(g_cupti_t0)) * 1e-3; };
  static const char* const kCat[] = {"kernel", "memcpy", "memset"};
  std::vector<profiler::DeviceRecord> recs;
  std::vector<profiler::LaunchRecord> launches;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const Interval& r : g_records)
      recs.push_back({r.name, kCat[r.kind], static_cast<int>(r.device), r.stream, us(r.start),
                      (static_cast<double>(r.end) - static_cast<double>(r.start)) * 1e-3, r.correlation});
    for (const ApiCall& a : g_api)
      if (a.correlation) launches.push_back({a.correlation, us(a.start)});
    for (const auto& [id, start] : g_driver_launches) launches.push_back({id, us(start)});
  }
  profiler::add_device_records(recs, launches);
}

void KernelProfiler::stop() {
  MG_CUPTI_CHECK(cuptiActivityFlushAll(1));
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
}

std::vector<KernelTotal> KernelProfiler::totals() const {
  std::map<std::string, KernelTotal> by;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Interval& r : g_records) {
    KernelTotal& t = by[r.name];
    t.name = r.name;
    ++t.calls;
    t.total_ms += (r.end - r.start) * 1e-6;
  }
  std::vector<KernelTotal> out;
  for (auto& [k, v] : by) out.push_back(v);
  std::sort(out.begin(), out.end(), [](const KernelTotal& a, const KernelTotal& b) { return a.total_ms > b.total_ms; });
  return out;
}

double KernelProfiler::busy_ms() const {
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const Interval& r : g_records) iv.emplace_back(r.start, r.end);
  }
  std::sort(iv.begin(), iv.end());
  double total = 0;
  uint64_t cur_s = 0, cur_e = 0;
  bool open = false;
  for (auto [s, e] : iv) {
    if (open && s <= cur_e) {
      cur_e = std::max(cur_e, e);
      continue;
    }
    if (open) total += (cur_e - cur_s) * 1e-6;
    cur_s = s, cur_e = e, open = true;
  }
  if (open) total += (cur_e - cur_s) * 1e-6;
  return total;
}

std::vector<CopySite> KernelProfiler::copy_sites() const {
  std::vector<const Interval*> iv;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Interval& r : g_records) iv.push_back(&r);
  std::sort(iv.begin(), iv.end(), [](const Interval* a, const Interval* b) { return a->start < b->start; });
  std::map<std::tuple<std::string, std::string, uint64_t>, CopySite> by;
  for (size_t i = 0; i < iv.size(); ++i) {
    if (iv[i]->kind == 0) continue;
    // The nearest kernel before it names the op that asked for it (copies run back to back).
    std::string before = "(start)";
    for (size_t j = i; j-- > 0;)
      if (iv[j]->kind == 0) {
        before = iv[j]->name;
        break;
      }
    CopySite& c = by[{iv[i]->name, before, iv[i]->bytes}];
    c.what = iv[i]->name, c.after_kernel = before, c.bytes = iv[i]->bytes;
    ++c.count, c.total_ms += (iv[i]->end - iv[i]->start) * 1e-6;
  }
  std::vector<CopySite> out;
  for (auto& [k, v] : by) out.push_back(v);
  std::sort(out.begin(), out.end(), [](const CopySite& a, const CopySite& b) { return a.count > b.count; });
  return out;
}

std::vector<ApiTotal> KernelProfiler::api_totals() const {
  std::map<uint32_t, ApiTotal> by;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const ApiCall& a : g_api) {
    ApiTotal& t = by[a.cbid];
    ++t.calls;
    t.total_ms += (a.end - a.start) * 1e-6;
  }
  std::vector<ApiTotal> out;
  for (auto& [cbid, t] : by) {
    t.name = api_name(cbid);
    out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const ApiTotal& a, const ApiTotal& b) { return a.total_ms > b.total_ms; });
  return out;
}

std::vector<IdleStretch> KernelProfiler::longest_idle(int n) const {
  std::vector<const Interval*> iv;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Interval& r : g_records) iv.push_back(&r);
  std::sort(iv.begin(), iv.end(), [](const Interval* a, const Interval* b) { return a->start < b->start; });
  std::vector<IdleStretch> all;
  uint64_t front = 0;
  const Interval* last = nullptr;
  for (const Interval* r : iv) {
    if (last != nullptr && r->start > front) all.push_back({last->name, r->name, front, r->start, {}, 0});
    if (last == nullptr || r->end > front) front = r->end, last = r;
  }
  std::sort(all.begin(), all.end(),
            [](const IdleStretch& a, const IdleStretch& b) { return a.end_ns - a.start_ns > b.end_ns - b.start_ns; });
  if (static_cast<int>(all.size()) > n) all.resize(n);
  // The host's runtime calls that started inside each stretch: what the device waited for.
  for (IdleStretch& g : all) {
    std::map<uint32_t, std::pair<int64_t, double>> by;
    for (const ApiCall& a : g_api)
      if (a.start >= g.start_ns && a.start < g.end_ns) {
        auto& [count, ms] = by[a.cbid];
        ++count, ms += (std::min(a.end, g.end_ns) - a.start) * 1e-6;
        g.api_ms += (std::min(a.end, g.end_ns) - a.start) * 1e-6;
      }
    for (auto& [cbid, v] : by) g.api.push_back({api_name(cbid), v.first, v.second});
    std::sort(g.api.begin(), g.api.end(), [](const ApiTotal& a, const ApiTotal& b) { return a.total_ms > b.total_ms; });
  }
  return all;
}

std::vector<IdleGap> KernelProfiler::idle_gaps() const {
  std::vector<const Interval*> iv;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Interval& r : g_records) iv.push_back(&r);
  std::sort(iv.begin(), iv.end(), [](const Interval* a, const Interval* b) { return a->start < b->start; });
  std::map<std::pair<std::string, std::string>, IdleGap> by;
  // Walk the records in start order, tracking the busy front (the latest end so far) and the
  // record that set it; a record starting after the front ends an idle stretch.
  uint64_t front = 0;
  const Interval* last = nullptr;
  for (const Interval* r : iv) {
    if (last != nullptr && r->start > front) {
      IdleGap& g = by[{last->name, r->name}];
      g.before = last->name, g.after = r->name;
      const double ms = (r->start - front) * 1e-6;
      ++g.count, g.total_ms += ms, g.max_ms = std::max(g.max_ms, ms);
    }
    if (last == nullptr || r->end > front) front = r->end, last = r;
  }
  std::vector<IdleGap> out;
  for (auto& [k, v] : by) out.push_back(v);
  std::sort(out.begin(), out.end(), [](const IdleGap& a, const IdleGap& b) { return a.total_ms > b.total_ms; });
  return out;
}

namespace {
// "<what>: N/step; <then>:" with N the items' counts summed over the steps.
template <class T>
void per_step_header(std::ostringstream& os, const std::vector<T>& items, int64_t T::*count, int steps,
                     const char* what, const char* then) {
  int64_t n = 0;
  for (const T& t : items) n += t.*count;
  char line[160];
  std::snprintf(line, sizeof line, "%s: %.1f/step; %s:\n", what, static_cast<double>(n) / steps, then);
  os << line;
}
}  // namespace

std::string KernelProfiler::report(int steps, double wall_ms_per_step, int top) const {
  const std::vector<KernelTotal> t = totals();
  double sum = 0;
  int64_t launches = 0;
  for (const KernelTotal& k : t) sum += k.total_ms, launches += k.calls;
  const double busy = busy_ms() / steps;
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-48s %8s %10s %6s\n", "kernel", "calls/st", "ms/step", "%");
  os << line;
  double rest = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (static_cast<int>(i) >= top) {
      rest += t[i].total_ms, rest_calls += t[i].calls;
      continue;
    }
    std::snprintf(line, sizeof line, "%-48.48s %8.1f %10.3f %6.1f\n", t[i].name.c_str(),
                  static_cast<double>(t[i].calls) / steps, t[i].total_ms / steps, 100.0 * t[i].total_ms / sum);
    os << line;
  }
  if (rest_calls) {
    std::snprintf(line, sizeof line, "%-48s %8.1f %10.3f %6.1f\n", "(all others)",
                  static_cast<double>(rest_calls) / steps, rest / steps, 100.0 * rest / sum);
    os << line;
  }
  std::snprintf(line, sizeof line,
                "device busy %.3f ms/step of %.3f ms wall (%.1f%%), %.0f launches/step, %.1f us mean per launch\n",
                busy, wall_ms_per_step, 100.0 * busy / wall_ms_per_step, static_cast<double>(launches) / steps,
                1000.0 * sum / std::max<int64_t>(launches, 1));
  os << line;
  // Where the device waits: the idle stretches between records, by the pair of kernels around
  // them (the host was late to launch the second, or waited on the first).
  const std::vector<IdleGap> gaps = idle_gaps();
  double idle = 0;
  for (const IdleGap& g : gaps) idle += g.total_ms;
  std::snprintf(line, sizeof line,
                "device idle %.3f ms/step between records; the largest, by the kernels around them:\n", idle / steps);
  os << line;
  for (size_t i = 0; i < gaps.size() && i < 8; ++i) {
    std::snprintf(line, sizeof line, "  %8.3f ms/step %6.1f/step max %7.1f us  %.36s -> %.36s\n",
                  gaps[i].total_ms / steps, static_cast<double>(gaps[i].count) / steps, 1000.0 * gaps[i].max_ms,
                  gaps[i].before.c_str(), gaps[i].after.c_str());
    os << line;
  }
  // The host's CUDA runtime calls, and what it called while the device sat in its longest waits.
  const std::vector<ApiTotal> api = api_totals();
  per_step_header(os, api, &ApiTotal::calls, steps, "CUDA runtime calls", "the costliest on the host");
  for (size_t i = 0; i < api.size() && i < 8; ++i) {
    std::snprintf(line, sizeof line, "  %8.1f/step %8.3f ms/step  %s\n", static_cast<double>(api[i].calls) / steps,
                  api[i].total_ms / steps, api[i].name.c_str());
    os << line;
  }
  for (const IdleStretch& g : longest_idle(3)) {
    std::snprintf(line, sizeof line, "idle %.1f us (%.36s -> %.36s): %.1f us of it in runtime calls",
                  (g.end_ns - g.start_ns) * 1e-3, g.before.c_str(), g.after.c_str(), 1000.0 * g.api_ms);
    os << line;
    for (size_t i = 0; i < g.api.size() && i < 4; ++i) {
      std::snprintf(line, sizeof line, "%s %s x%lld %.1f us", i == 0 ? ":" : ",", g.api[i].name.c_str(),
                    static_cast<long long>(g.api[i].calls), 1000.0 * g.api[i].total_ms);
      os << line;
    }
    os << "\n";
  }
  // Copies and fills, by size and the kernel before them (the op that asked for them).
  const std::vector<CopySite> sites = copy_sites();
  per_step_header(os, sites, &CopySite::count, steps, "copies and fills",
                  "the most frequent, by size and the kernel before");
  for (size_t i = 0; i < sites.size() && i < 8; ++i) {
    std::snprintf(line, sizeof line, "  %6.1f/step %8.3f ms/step  %s %10llu B after %.40s\n",
                  static_cast<double>(sites[i].count) / steps, sites[i].total_ms / steps, sites[i].what.c_str(),
                  static_cast<unsigned long long>(sites[i].bytes), sites[i].after_kernel.c_str());
    os << line;
  }
  return os.str();
}

KernelProfiler& trace_kernels() {
  static KernelProfiler p;
  return p;
}

namespace {

// profiler::start() and stop() drive the trace's kernel profiler when a GPU is present. It links
// the driver's launches too: cuBLAS and cuDNN launch through the driver, and their kernels find
// their op only that way.
bool g_tracing_device = false;

void start_device_trace() {
  int n = 0;
  g_tracing_device = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!g_tracing_device) {
    cudaGetLastError();  // no device: the trace stays the host's
    return;
  }
  trace_kernels().start(/*link_driver_launches=*/true);
}

void stop_device_trace() {
  if (!g_tracing_device) return;
  g_tracing_device = false;
  cudaDeviceSynchronize();  // the work launched while tracing, finished and recorded
  trace_kernels().stop();
  trace_kernels().add_to_trace();
}

const bool g_registered = [] {
  set_device_tracer({start_device_trace, stop_device_trace});
  return true;
}();

}  // namespace

}  // namespace mg::profiler
