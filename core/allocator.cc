#include "core/allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/enum_name.h"
#include "core/error.h"
#include "core/profiler.h"

namespace mg {

const char* memory_category_name(MemoryCategory c) {
  return enum_name(c, {"other", "parameters", "gradients", "optimizer_state", "activations", "data", "gathered"});
}

namespace {
thread_local MemoryCategory tl_category = MemoryCategory::Other;
}

MemoryCategoryGuard::MemoryCategoryGuard(MemoryCategory c) : prev_(tl_category) { tl_category = c; }
MemoryCategoryGuard::~MemoryCategoryGuard() { tl_category = prev_; }
MemoryCategory MemoryCategoryGuard::current() { return tl_category; }

namespace {
// One slot for the CPU and up to 64 CUDA devices; never destroyed (storages may be released
// during static destruction).
CategoryStats* stats_slots() {
  static CategoryStats* slots = new CategoryStats[65];
  return slots;
}

// A trace's memory counter track for these stats (core/profiler.h): live bytes by category.
constexpr size_t kCategories = static_cast<size_t>(MemoryCategory::kCount);
void trace_counters(const CategoryStats* s, const std::array<MemoryCounter, kCategories>& by_cat,
                    const MemoryCounter& total) {
  static const std::string* names = [] {
    auto* n = new std::string[65];
    n[0] = "memory cpu";
    for (int i = 0; i < 64; ++i) n[1 + i] = "memory cuda:" + std::to_string(i);
    return n;
  }();
  std::pair<const char*, int64_t> series[kCategories + 1];
  for (size_t i = 0; i < by_cat.size(); ++i)
    series[i] = {memory_category_name(static_cast<MemoryCategory>(i)), by_cat[i].current};
  series[kCategories] = {"total", total.current};
  profiler::counter(names[s - stats_slots()], series, kCategories + 1);
}
}  // namespace

CategoryStats& CategoryStats::get(Device d) {
  CategoryStats* slots = stats_slots();
  MG_CHECK(d.is_cpu() || (d.index >= 0 && d.index < 64), DeviceError, "CategoryStats: device index ", d.index,
           " out of range");
  return slots[d.is_cpu() ? 0 : 1 + d.index];
}

void CategoryStats::on_alloc(MemoryCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  by_cat_[static_cast<size_t>(c)].add(bytes);
  int64_t old_peak = total_.peak;
  total_.add(bytes);
  if (total_.peak > old_peak)
    for (size_t i = 0; i < by_cat_.size(); ++i) at_peak_[i] = by_cat_[i].current;
  if (profiler::enabled()) trace_counters(this, by_cat_, total_);
}

void CategoryStats::on_free(MemoryCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  by_cat_[static_cast<size_t>(c)].sub(bytes);
  total_.sub(bytes);
  if (profiler::enabled()) trace_counters(this, by_cat_, total_);
}

MemoryCounter CategoryStats::counter(MemoryCategory c) const {
  std::lock_guard<std::mutex> g(mu_);
  return by_cat_[static_cast<size_t>(c)];
}

std::array<int64_t, static_cast<size_t>(MemoryCategory::kCount)> CategoryStats::at_peak() const {
  std::lock_guard<std::mutex> g(mu_);
  return at_peak_;
}

MemoryCounter CategoryStats::total() const {
  std::lock_guard<std::mutex> g(mu_);
  return total_;
}

void CategoryStats::reset_peak() {
  std::lock_guard<std::mutex> g(mu_);
  total_.reset_peak();
  for (size_t i = 0; i < by_cat_.size(); ++i) {
    by_cat_[i].reset_peak();
    at_peak_[i] = by_cat_[i].current;
  }
}

void* CpuAllocator::allocate(size_t nbytes) {
  // Rounding a request within 63 bytes of SIZE_MAX up to 64 would wrap to a tiny block; no
  // host has 2^62 bytes, so anything above that fails here, before the rounding.
  void* p = nullptr;
  if (nbytes <= (size_t{1} << 62)) p = std::aligned_alloc(64, std::max<size_t>((nbytes + 63) / 64 * 64, 64));
  MG_CHECK(p != nullptr, OutOfMemoryError, "CpuAllocator: failed to allocate ", format_bytes(nbytes), " (",
           format_bytes(bytes_.current), " currently allocated by memgrad on the CPU)");
  std::lock_guard<std::mutex> g(mu_);
  bytes_.add(static_cast<int64_t>(nbytes));
  count_.add(1);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (!ptr) return;
  std::free(ptr);
  std::lock_guard<std::mutex> g(mu_);
  bytes_.sub(static_cast<int64_t>(nbytes));
  count_.sub(1);
}

std::map<std::string, int64_t> CpuAllocator::memory_stats() const {
  std::lock_guard<std::mutex> g(mu_);
  std::map<std::string, int64_t> m;
  auto put = [&](const std::string& k, const MemoryCounter& c) {
    m[k + ".current"] = c.current;
    m[k + ".peak"] = c.peak;
    m[k + ".allocated"] = c.allocated;
    m[k + ".freed"] = c.freed;
  };
  put("allocated_bytes.all", bytes_);
  put("reserved_bytes.all", bytes_);
  put("active_bytes.all", bytes_);
  put("allocation.all", count_);
  return m;
}

void CpuAllocator::reset_peak_memory_stats() {
  std::lock_guard<std::mutex> g(mu_);
  bytes_.reset_peak();
  count_.reset_peak();
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();
  return *a;
}

namespace {
AllocatorFactory g_cuda_factory = nullptr;
}

void register_cuda_allocator(AllocatorFactory f) { g_cuda_factory = f; }

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  MG_CHECK(g_cuda_factory != nullptr, DeviceError, "allocator_for(", d,
           "): this build of memgrad has no CUDA backend (built with --config=nocuda or without the toolkit)");
  return g_cuda_factory(d.index);
}

static int64_t stat(Device d, const char* key) {
  auto m = allocator_for(d).memory_stats();
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

int64_t memory_allocated(Device d) { return stat(d, "allocated_bytes.all.current"); }
int64_t max_memory_allocated(Device d) { return stat(d, "allocated_bytes.all.peak"); }
int64_t memory_reserved(Device d) { return stat(d, "reserved_bytes.all.current"); }
int64_t max_memory_reserved(Device d) { return stat(d, "reserved_bytes.all.peak"); }
void reset_peak_memory_stats(Device d) {
  allocator_for(d).reset_peak_memory_stats();
  CategoryStats::get(d).reset_peak();
}
std::map<std::string, int64_t> memory_stats(Device d) { return allocator_for(d).memory_stats(); }

}  // namespace mg
