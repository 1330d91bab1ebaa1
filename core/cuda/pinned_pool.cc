// The caching pool of page-locked host memory behind cuda::PinnedBlock (core/cuda_memory.h).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda_memory.h"
#include "core/format_bytes.h"

namespace mg::cuda {

namespace {

constexpr size_t kPage = size_t{4} << 10;
constexpr size_t kLarge = size_t{1} << 20;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t round_size(size_t bytes) {
  const size_t unit = bytes >= kLarge ? kLargeRound : kPage;
  return (std::max<size_t>(bytes, 1) + unit - 1) / unit * unit;
}

class Pool {
 public:
  void* take(size_t size) {
    std::lock_guard<std::mutex> g(mu_);
    collect();
    auto it = free_.find(size);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(size);
      stats_.in_use_bytes += static_cast<int64_t>(size);
      ++stats_.reuses;
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      MG_THROW(DeviceError, "PinnedBlock::allocate: cudaHostAlloc of ", format_bytes(static_cast<int64_t>(size)),
               " failed (", cudaGetErrorString(e), "); the pool holds ", format_bytes(stats_.in_use_bytes),
               " in use and ", format_bytes(stats_.cached_bytes), " cached");
    }
    ++stats_.host_allocs;
    stats_.in_use_bytes += static_cast<int64_t>(size);
    return p;
  }

  void give_back(void* p, size_t size, std::vector<Event>&& uses) {
    std::lock_guard<std::mutex> g(mu_);
    stats_.in_use_bytes -= static_cast<int64_t>(size);
    stats_.cached_bytes += static_cast<int64_t>(size);
    pending_.push_back({p, size, std::move(uses)});
  }

  PinnedPoolStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
  }

  void empty() {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& b : pending_) {
      for (const Event& e : b.uses) e.synchronize();
      free_.emplace(b.size, b.data);
    }
    pending_.clear();
    for (auto& [size, p] : free_) {
      (void)cudaFreeHost(p);
      stats_.cached_bytes -= static_cast<int64_t>(size);
    }
    free_.clear();
  }

 private:
  struct Pending {
    void* data;
    size_t size;
    std::vector<Event> uses;
  };
  // Moves blocks whose recorded work has finished to the free lists.
  void collect() {
    for (size_t i = 0; i < pending_.size();) {
      bool done = true;
      for (const Event& e : pending_[i].uses) done = done && e.query();
      if (!done) {
        ++i;
        continue;
      }
      free_.emplace(pending_[i].size, pending_[i].data);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::vector<Pending> pending_;
  PinnedPoolStats stats_;
};

Pool& pool() {
  static auto* p = new Pool();  // never destroyed: blocks may be returned during exit
  return *p;
}

}  // namespace

PinnedBlock PinnedBlock::allocate(size_t bytes) {
  PinnedBlock b;
  b.size_ = round_size(bytes);
  b.data_ = pool().take(b.size_);
  return b;
}

PinnedBlock::~PinnedBlock() { release(); }

Tensor PinnedBlock::view(const Shape& shape, DType dtype) const {
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  MG_CHECK(nbytes <= size_, ValueError, "PinnedBlock::view: ", shape_str(shape), " ", dtype, " needs ", nbytes,
           " bytes, the block has ", size_);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = adopt_storage(data_, nbytes, Device::cpu(), [](void*) {});  // the block owns the memory
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->version = std::make_shared<uint32_t>(0);
  return Tensor(impl);
}

PinnedBlock::PinnedBlock(PinnedBlock&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), uses_(std::move(o.uses_)) {}

PinnedBlock& PinnedBlock::operator=(PinnedBlock&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    uses_ = std::move(o.uses_);
  }
  return *this;
}

void PinnedBlock::record(const Stream& s) {
  MG_CHECK(data_ != nullptr, ValueError, "PinnedBlock::record: the block is empty (moved from or never allocated)");
  Event e;
  e.record(s);
  uses_.push_back(std::move(e));
}

void PinnedBlock::release() {
  if (!data_) return;
  pool().give_back(data_, size_, std::move(uses_));
  data_ = nullptr;
  size_ = 0;
  uses_.clear();
}

PinnedPoolStats pinned_pool_stats() { return pool().stats(); }

void empty_pinned_cache() { pool().empty(); }

}  // namespace mg::cuda
