// Indexing on CUDA: one_hot, gather/scatter(_add), index_select/index_add, nll_loss.
// Index values are validated on the device before any kernel reads through them: a check
// kernel records the first bad value and one small device->host read raises
// mg::IndexError with the CPU kernels' message (inside a kernels::DeferredIndexChecks scope the
// read waits for the scope's finish(); the kernels skip a bad index meanwhile) (legal: [0, size); negative indices are
// out of bounds, like PyTorch and the CPU side). i32 indices are widened to i64 first (index tensors are small). Pure
// data movement dispatches on the element size; the adding forms use atomics.
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/deferred_read.h"
#include "kernels/deferred_checks.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

struct BadIndex {
  unsigned long long flag;
  long long value;
};

// Legal: lo <= v < hi, or v == ignore when use_ignore.
__global__ void check_index_kernel(const int64_t* idx, OffsetCalc<1> oc, int64_t n, int64_t lo, int64_t hi,
                                   bool use_ignore, int64_t ignore, BadIndex* bad) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[1];
    oc.get(i, off);
    const int64_t v = idx[off[0]];
    if ((v < lo || v >= hi) && !(use_ignore && v == ignore)) {
      if (atomicCAS(&bad->flag, 0ull, 1ull) == 0ull) bad->value = v;
    }
  }
}

// i64 view of an index tensor (i32 is widened on the device).
Tensor as_i64(const Tensor& index) { return index.dtype() == DType::i64 ? index : raw::to_dtype(index, DType::i64); }

// Queues the check of idx against [lo, hi) (ignore allowed when use_ignore) on stream st: a
// zeroed BadIndex on the device, then the kernel that records the first bad value into it.
// Returns that buffer (freed in stream order, so a copy queued after it reads it first).
Tensor queue_check(const Tensor& idx, int64_t lo, int64_t hi, bool use_ignore, int64_t ignore, cudaStream_t st) {
  Tensor buf = empty({2}, {DType::i64, idx.device()});
  MG_CUDA_CHECK(cudaMemsetAsync(buf.raw_data(), 0, sizeof(BadIndex), st));
  auto oc = make_offset_calc<1>(idx.sizes(), {&idx.strides()});
  check_index_kernel<<<blocks_for(idx.numel()), kBlock, 0, st>>>(static_cast<const int64_t*>(idx.raw_data()), oc,
                                                                 idx.numel(), lo, hi, use_ignore, ignore,
                                                                 static_cast<BadIndex*>(buf.raw_data()));
  MG_CUDA_CHECK_LAUNCH("index check");
  return buf;
}

// Returns the first out-of-range value found (has_bad false when all are legal).
bool find_bad(const Tensor& idx, int64_t lo, int64_t hi, bool use_ignore, int64_t ignore, int64_t* value) {
  // Inside a CUDA graph capture the result could only be read at replay: no host check then
  // (docs/cuda_graphs.md: indices in a captured step are the caller's to keep in range).
  if (idx.numel() == 0 || mg::cuda::is_capturing(idx.device().index)) return false;
  cudaStream_t st = stream_of(idx);
  const Tensor buf = queue_check(idx, lo, hi, use_ignore, ignore, st);
  BadIndex found{};
  MG_CUDA_CHECK(cudaMemcpyAsync(&found, buf.raw_data(), sizeof(BadIndex), cudaMemcpyDeviceToHost, st));
  MG_CUDA_CHECK(cudaStreamSynchronize(st));
  *value = found.value;
  return found.flag != 0;
}

// Checks idx against [lo, hi) (ignore allowed when use_ignore) and calls raise(bad value), which
// throws. Inside a DeferredIndexChecks scope the check's finding is read at the scope's finish(),
// outside one at once (cuda::read_to_host).
void check_or_defer(const Tensor& idx, int64_t lo, int64_t hi, bool use_ignore, int64_t ignore,
                    std::function<void(int64_t)> raise) {
  if (idx.numel() == 0 || mg::cuda::is_capturing(idx.device().index)) return;  // as find_bad
  cudaStream_t st = stream_of(idx);
  const Tensor buf = queue_check(idx, lo, hi, use_ignore, ignore, st);
  auto settle = [raise](const void* host) {
    BadIndex found;
    std::memcpy(&found, host, sizeof found);
    if (found.flag != 0) raise(found.value);
  };
  read_to_host(buf.raw_data(), sizeof(BadIndex), idx.device().index, st, settle);
}

}  // namespace

namespace cuda {

namespace {
// Pinned host slots for reads a DeferredIndexChecks scope holds, each with an event that marks
// its copy done: a pool per thread (scopes are), allocated once, never freed (threads can end
// after the driver is gone). A scope holding more than kSlots reads makes the rest at once.
constexpr int kSlots = 64;
struct PinnedSlots {
  unsigned char (*host)[kDeferredReadBytes] = nullptr;
  cudaEvent_t event[kSlots] = {};
  int event_device[kSlots] = {};
  std::vector<int> free;
};
PinnedSlots& slots() {
  thread_local PinnedSlots* s = [] {
    auto* p = new PinnedSlots();
    MG_CUDA_CHECK(
        cudaHostAlloc(reinterpret_cast<void**>(&p->host), kSlots * kDeferredReadBytes, cudaHostAllocPortable));
    for (int i = kSlots - 1; i >= 0; --i) p->free.push_back(i);
    return p;
  }();
  return *s;
}
}  // namespace

void read_to_host(const void* src, size_t bytes, int device, cudaStream_t st,
                  std::function<void(const void* host)> settle) {
  MG_CHECK(bytes <= kDeferredReadBytes, ValueError, "read_to_host: ", bytes, " bytes, at most ", kDeferredReadBytes);
  DeferredIndexChecks* scope = DeferredIndexChecks::current();
  if (scope == nullptr || slots().free.empty()) {  // read now: the host waits for st (no slots made outside a scope)
    unsigned char now[kDeferredReadBytes];
    MG_CUDA_CHECK(cudaMemcpyAsync(now, src, bytes, cudaMemcpyDeviceToHost, st));
    MG_CUDA_CHECK(cudaStreamSynchronize(st));
    settle(now);
    return;
  }
  PinnedSlots& ps = slots();
  const int slot = ps.free.back();
  if (ps.event[slot] && ps.event_device[slot] != device) {
    MG_CUDA_CHECK(cudaEventDestroy(ps.event[slot]));
    ps.event[slot] = nullptr;
  }
  if (!ps.event[slot]) {
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&ps.event[slot], cudaEventDisableTiming));
    ps.event_device[slot] = device;
  }
  MG_CUDA_CHECK(cudaMemcpyAsync(ps.host[slot], src, bytes, cudaMemcpyDeviceToHost, st));
  MG_CUDA_CHECK(cudaEventRecord(ps.event[slot], st));
  ps.free.pop_back();  // taken once its copy and event are queued: a failure above leaves it free
  scope->defer([slot, settle = std::move(settle)] {
    PinnedSlots& mine = slots();
    const cudaError_t e = cudaEventSynchronize(mine.event[slot]);
    unsigned char found[kDeferredReadBytes];
    std::memcpy(found, mine.host[slot], kDeferredReadBytes);
    mine.free.push_back(slot);
    MG_CUDA_CHECK(e);
    settle(found);
  });
}

}  // namespace cuda

namespace {

// What gather/scatter/index_select/index_add index with: the index as i64, checked against
// [0, size), and the indexed tensor's size and stride along `dim` (1 and 0 for a 0-d tensor).
struct DimIndex {
  Tensor idx;
  int64_t size, stride;
};
// With `checked` (the caller checked them already) the check and its synchronization are skipped;
// the kernels still skip an index out of range rather than touch memory outside the tensor.
DimIndex dim_index(const Tensor& t, int64_t dim, const Tensor& index, const char* op, bool checked = false) {
  DimIndex d{as_i64(index), t.dim() ? t.size(dim) : 1, t.dim() ? t.stride(dim) : 0};
  if (!checked)
    check_or_defer(d.idx, 0, d.size, false, 0, [op, dim, size = d.size](int64_t v) {
      MG_THROW(IndexError, op, ": index ", v, " is out of bounds for dim ", dim, " with size ", size);
    });
  return d;
}

// out[o] = a[base + index[i] * sd] over index's (or out's) shape.
template <class E>
__global__ void gather_kernel(const E* a, const int64_t* idx, E* out, OffsetCalc<3> oc, int64_t n, int64_t size,
                              int64_t sd) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);  // out, index, a (dim stride zeroed)
    const int64_t j = idx[off[1]];
    if (j < 0 || j >= size) continue;  // skipped: it raised before launch, or raises at a scope's finish()
    out[off[0]] = a[off[2] + j * sd];
  }
}

template <class E>
__global__ void scatter_kernel(E* self, const int64_t* idx, const E* src, OffsetCalc<3> oc, int64_t n, int64_t size,
                               int64_t sd) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);  // self (dim stride zeroed), index, src
    const int64_t j = idx[off[1]];
    if (j < 0 || j >= size) continue;  // skipped: it raised before launch, or raises at a scope's finish()
    self[off[0] + j * sd] = src[off[2]];
  }
}

template <class T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> ||
                std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    atomicAdd(p, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));  // two's complement
  } else if constexpr (std::is_same_v<T, bool>) {
    if (v) *p = true;  // x + y != 0 is x || y; racing writers all store true
  } else {             // uint8_t: CAS on the aligned 32-bit word that holds it
    unsigned int* word = reinterpret_cast<unsigned int*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
    const unsigned int shift = (reinterpret_cast<uintptr_t>(p) & 3) * 8;
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      const unsigned int byte = ((assumed >> shift) + static_cast<unsigned int>(v)) & 0xffu;
      old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
    } while (old != assumed);
  }
}

template <class T>
__global__ void scatter_add_kernel(T* self, const int64_t* idx, const T* src, OffsetCalc<3> oc, int64_t n, int64_t size,
                                   int64_t sd) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);
    const int64_t j = idx[off[1]];
    if (j < 0 || j >= size) continue;  // skipped: it raised before launch, or raises at a scope's finish()
    atomic_add(self + off[0] + j * sd, src[off[2]]);
  }
}

__global__ void one_hot_kernel(const int64_t* idx, int64_t* out, OffsetCalc<2> oc, int64_t n, int64_t sc,
                               int64_t classes) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[2];
    oc.get(i, off);  // index, out row
    const int64_t c = idx[off[0]];
    if (c >= 0 && c < classes) out[off[1] + c * sc] = 1;  // always true: checked before launch
  }
}

template <class T>
__global__ void nll_kernel(const T* lp, const int64_t* target, T* out, OffsetCalc<3> oc, int64_t n, int64_t sc,
                           int64_t classes, int64_t ignore) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);  // out, target, log_probs (class dim removed)
    const int64_t t = target[off[1]];
    const bool skip = t == ignore || t < 0 || t >= classes;  // out of range never gets here: checked before launch
    out[off[0]] = skip ? store_m<T>(math_t<T>(0)) : store_m<T>(-load_m(lp[off[2] + t * sc]));
  }
}

// Strides that walk a 1-D (or 0-D) index along `dim` of an n-dim shape.
Shape index_strides_along(const Tensor& index, int64_t dim, int64_t ndim) {
  Shape s(ndim, 0);
  if (ndim > 0 && index.dim() == 1) s[dim] = index.stride(0);
  return s;
}

// gather_kernel over n elements (gather and index_select differ only in the walk `oc`).
void launch_gather(const char* op, const Tensor& a, const DimIndex& d, const Tensor& out, const OffsetCalc<3>& oc,
                   int64_t n) {
  by_size(a.dtype(), op, [&](auto tag) {
    using E = decltype(tag);
    gather_kernel<E><<<blocks_for(n), kBlock, 0, stream_of(out)>>>(data_as<const E>(a), data_as<const int64_t>(d.idx),
                                                                   data_as<E>(out), oc, n, d.size, d.stride);
  });
  MG_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

template <>
void CudaBackend::one_hot(const Tensor& indices, int64_t num_classes, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  Tensor idx = as_i64(indices);
  int64_t v;
  if (find_bad(idx, 0, num_classes, false, 0, &v))
    MG_THROW(IndexError, "one_hot: class index ", v, " out of range [0, ", num_classes, ")");
  raw::fill_(out, 0.0);
  const int64_t n = idx.numel();
  if (n == 0 || num_classes == 0) return;
  Shape ost(out.strides().begin(), out.strides().end() - 1);
  auto oc = make_offset_calc<2>(idx.sizes(), {&idx.strides(), &ost});
  one_hot_kernel<<<blocks_for(n), kBlock, 0, stream_of(out)>>>(static_cast<const int64_t*>(idx.raw_data()),
                                                               static_cast<int64_t*>(out.raw_data()), oc, n,
                                                               out.strides().back(), num_classes);
  MG_CUDA_CHECK_LAUNCH("one_hot");
}

template <>
void CudaBackend::gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  const DimIndex d = dim_index(a, dim, index, "gather");
  const int64_t n = d.idx.numel();
  if (n == 0) return;
  const Shape ast = strides_without(a, dim);
  auto oc = make_offset_calc<3>(d.idx.sizes(), {&out.strides(), &d.idx.strides(), &ast});
  launch_gather("gather", a, d, out, oc, n);
}

template <>
void CudaBackend::scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add) {
  const char* op = add ? "scatter_add_" : "scatter_";
  mg::cuda::DeviceGuard g(self.device());
  const DimIndex d = dim_index(self, dim, index, op);
  const int64_t n = d.idx.numel();
  if (n == 0) return;
  const Shape sst = strides_without(self, dim);
  auto oc = make_offset_calc<3>(d.idx.sizes(), {&sst, &d.idx.strides(), &src.strides()});
  cudaStream_t st = stream_of(self);
  const int64_t* pi = static_cast<const int64_t*>(d.idx.raw_data());
  const int64_t size = d.size, sd = d.stride;
  if (add) {
    MG_CUDA_DISPATCH_ALL(self.dtype(), op, [&] {
      scatter_add_kernel<scalar_t><<<blocks_for(n), kBlock, 0, st>>>(
          static_cast<scalar_t*>(self.raw_data()), pi, static_cast<const scalar_t*>(src.raw_data()), oc, n, size, sd);
    });
  } else {
    by_size(self.dtype(), op, [&](auto tag) {
      using E = decltype(tag);
      scatter_kernel<E><<<blocks_for(n), kBlock, 0, st>>>(static_cast<E*>(self.raw_data()), pi,
                                                          static_cast<const E*>(src.raw_data()), oc, n, size, sd);
    });
  }
  MG_CUDA_CHECK_LAUNCH(op);
}

template <>
void CudaBackend::index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  const DimIndex d = dim_index(a, dim, index, "index_select");
  const int64_t n = out.numel();
  if (n == 0) return;
  if (a.dim() == 0) return raw::copy_(out, a);
  // The gather pattern over out's shape: the index walks along `dim`, `a` is fixed there.
  const Shape ist = index_strides_along(d.idx, dim, out.dim());
  const Shape ast = strides_without(a, dim);
  auto oc = make_offset_calc<3>(out.sizes(), {&out.strides(), &ist, &ast});
  launch_gather("index_select", a, d, out, oc, n);
}

template <>
void CudaBackend::index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool checked) {
  mg::cuda::DeviceGuard g(self.device());
  const DimIndex d = dim_index(self, dim, index, "index_add_", checked);
  const int64_t n = src.numel();
  if (n == 0) return;
  const Shape sst = strides_without(self, dim);
  const Shape ist = index_strides_along(d.idx, dim, src.dim());
  auto oc = make_offset_calc<3>(src.sizes(), {&sst, &ist, &src.strides()});
  MG_CUDA_DISPATCH_ALL(self.dtype(), "index_add_", [&] {
    scatter_add_kernel<scalar_t><<<blocks_for(n), kBlock, 0, stream_of(self)>>>(
        static_cast<scalar_t*>(self.raw_data()), static_cast<const int64_t*>(d.idx.raw_data()),
        static_cast<const scalar_t*>(src.raw_data()), oc, n, d.size, d.stride);
  });
  MG_CUDA_CHECK_LAUNCH("index_add_");
}

template <>
void CudaBackend::nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                                   const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  Tensor tgt = as_i64(target);
  const int64_t cdim = log_probs.dim() == 1 ? 0 : 1;
  const int64_t C = log_probs.size(cdim);
  const int64_t sc = log_probs.stride(cdim);
  int64_t v;
  if (find_bad(tgt, 0, C, true, ignore_index, &v))
    MG_THROW(IndexError, "nll_loss_forward: target ", v, " out of range [0, ", C, ")");
  const int64_t n = tgt.numel();
  if (n == 0) return;
  Shape lp_st = log_probs.strides();
  lp_st.erase(lp_st.begin() + cdim);
  auto oc = make_offset_calc<3>(tgt.sizes(), {&out.strides(), &tgt.strides(), &lp_st});
  MG_CUDA_DISPATCH_FLOAT(log_probs.dtype(), "nll_loss_forward", [&] {
    nll_kernel<scalar_t><<<blocks_for(n), kBlock, 0, stream_of(out)>>>(
        static_cast<const scalar_t*>(log_probs.raw_data()), static_cast<const int64_t*>(tgt.raw_data()),
        static_cast<scalar_t*>(out.raw_data()), oc, n, sc, C, ignore_index);
  });
  MG_CUDA_CHECK_LAUNCH("nll_loss_forward");
}

}  // namespace mg::kernels
