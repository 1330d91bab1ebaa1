// Wires the CUDA backend into core at start-up: one caching allocator per device behind
// mg::Allocator, and the copy/fill/random hooks. Linked with alwayslink so the static
// registration runs whenever the CUDA backend is part of the binary.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator/caching_allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/cuda_device_memory.h"
#include "core/cuda_memory.h"
#include "core/format_bytes.h"

namespace mg::cuda {

using namespace allocator;  // this backend serves the caching allocator (core/allocator/)

void register_copy_hooks();  // core/cuda/copy.cu

namespace {

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device) : device_(device), memory_(device), caching_(memory_, device) {}
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    StreamId s = reinterpret_cast<StreamId>(Stream::current(device_).handle());
    return caching_.allocate(nbytes, s);
  }
  void deallocate(void* ptr, size_t) override {
    if (ptr) caching_.free(ptr);
  }
  Device device() const override { return Device::cuda(device_); }
  std::map<std::string, int64_t> memory_stats() const override { return caching_.memory_stats(); }
  void reset_peak_memory_stats() override { caching_.reset_peak_memory_stats(); }
  CachingAllocator& caching() { return caching_; }

 private:
  int device_;
  CudaDeviceMemory memory_;
  CachingAllocator caching_;
};

std::mutex g_mu;
std::vector<std::unique_ptr<DeviceAllocator>>& allocators() {
  static auto* v = new std::vector<std::unique_ptr<DeviceAllocator>>();  // never destroyed: storages may outlive main
  return *v;
}

DeviceAllocator& device_allocator(int index) {
  std::lock_guard<std::mutex> g(g_mu);
  int n = device_count();
  MG_CHECK(index >= 0 && index < n, DeviceError, "cuda allocator: device cuda:", index, " does not exist (", n,
           " visible CUDA device", n == 1 ? "" : "s", ")");
  auto& v = allocators();
  if (v.size() < static_cast<size_t>(n)) v.resize(n);
  if (!v[index]) v[index] = std::make_unique<DeviceAllocator>(index);
  return *v[index];
}

Allocator& factory(int index) { return device_allocator(index); }

struct Registrar {
  Registrar() {
    register_cuda_allocator(&factory);
    register_copy_hooks();
  }
} registrar;

}  // namespace

CachingAllocator& caching_allocator(int device) { return device_allocator(device).caching(); }

void empty_cache() {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto& a : allocators())
    if (a) a->caching().empty_cache();
}

std::string memory_summary(int device) { return caching_allocator(device).memory_summary(); }

void set_per_process_memory_fraction(double fraction, int device) {
  caching_allocator(device).set_memory_fraction(fraction);
}

void set_per_process_memory_limit(int64_t bytes, int device) {
  MG_CHECK(bytes >= 0, ValueError, "set_per_process_memory_limit: bytes must be >= 0, got ", bytes);
  if (bytes == 0)
    caching_allocator(device).clear_memory_limit();
  else
    caching_allocator(device).set_memory_limit(static_cast<size_t>(bytes));
}

void record_stream(const Tensor& t, const Stream& stream) {
  MG_CHECK(t.is_cuda(), DeviceError, "record_stream: tensor is on ", t.device(), ", expected a CUDA tensor");
  caching_allocator(t.device().index).record_stream(t.storage()->data, reinterpret_cast<StreamId>(stream.handle()));
}

void set_expandable_segments(bool enabled, int device) { caching_allocator(device).set_expandable_segments(enabled); }

void record_memory_history(bool enabled, int device, int64_t max_entries) {
  caching_allocator(device).record_history(enabled, static_cast<size_t>(max_entries));
}
void write_memory_snapshot(const std::string& json_path, int device) {
  caching_allocator(device).write_snapshot_json(json_path);
}
void write_memory_timeline(const std::string& html_path, int device) {
  caching_allocator(device).write_timeline_html(html_path);
}

Fragmentation fragmentation(int device) {
  FragmentationInfo f = caching_allocator(device).fragmentation();
  Fragmentation out;
  out.largest_free_block = static_cast<int64_t>(f.largest_free_block);
  out.reserved_unallocated = static_cast<int64_t>(f.reserved_unallocated);
  out.ratio =
      f.free_cached ? 1.0 - static_cast<double>(f.largest_free_block) / static_cast<double>(f.free_cached) : 0.0;
  return out;
}

Tensor pin_memory(const Tensor& t) {
  MG_CHECK(t.device().is_cpu(), DeviceError, "pin_memory: expected a CPU tensor, got one on ", t.device());
  size_t n = t.nbytes();
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    MG_THROW(OutOfMemoryError, "pin_memory: cannot pin ", format_bytes(static_cast<int64_t>(n)), " of host memory (",
             cudaGetErrorString(e), "); the host's pinned memory already holds ",
             format_bytes(CategoryStats::get(Device::cpu()).total().current), " of tensors counted by category");
  }
  // Host-resident state counts in the host's categories (what was active when it was pinned:
  // parameters for a host master, optimizer state for its moments), as the device's does.
  const MemoryCategory cat = MemoryCategoryGuard::current();
  CategoryStats::get(Device::cpu()).on_alloc(cat, static_cast<int64_t>(n));
  Storage st = adopt_storage(p, n, Device::cpu(), [cat, n](void* q) {
    (void)cudaFreeHost(q);
    CategoryStats::get(Device::cpu()).on_free(cat, static_cast<int64_t>(n));
  });
  st->category = cat;  // what a copy of it counts as (Module::to keeps a tensor's category)
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->sizes = t.sizes();
  impl->strides = contiguous_strides(t.sizes());
  impl->dtype = t.dtype();
  impl->version = std::make_shared<uint32_t>(0);
  Tensor out(impl);
  raw::copy_(out, t);
  return out;
}

bool is_pinned(const Tensor& t) {
  if (!t.defined() || !t.device().is_cpu()) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, t.storage()->data) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace mg::cuda
