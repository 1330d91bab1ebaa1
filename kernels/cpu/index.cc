// Indexing CPU kernels: one_hot, gather/scatter, index_select/index_add.
// Index values are bounds-checked here (only the kernel reads them) and raise
// mg::IndexError naming the op, the bad index and the size.
#include <cstring>

#include "core/strided_loop.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

// Like PyTorch, negative indices are out of bounds here (no Python-style wrapping).
inline int64_t checked(int64_t i, int64_t size, const char* op, int64_t dim) {
  if (i < 0 || i >= size)
    MG_THROW(IndexError, op, ": index ", i, " is out of bounds for dim ", dim, " with size ", size);
  return i;
}

// Reads the index tensor (i64 or i32) as int64 values in logical order.
std::vector<int64_t> index_values(const Tensor& index) {
  std::vector<int64_t> v;
  if (index.dtype() == DType::i64) return index.to_vector<int64_t>();
  std::vector<int32_t> v32 = index.to_vector<int32_t>();
  return std::vector<int64_t>(v32.begin(), v32.end());
}

}  // namespace

template <>
void CpuBackend::one_hot(const Tensor& indices, int64_t num_classes, const Tensor& out) {
  std::vector<int64_t> idx = index_values(indices);
  int64_t* po = static_cast<int64_t*>(out.raw_data());
  std::memset(po, 0, out.numel() * sizeof(int64_t));
  for (size_t i = 0; i < idx.size(); ++i) {
    MG_CHECK(idx[i] >= 0 && idx[i] < num_classes, IndexError, "one_hot: class index ", idx[i], " out of range [0, ",
             num_classes, ")");
    po[static_cast<int64_t>(i) * num_classes + idx[i]] = 1;
  }
}

template <>
void CpuBackend::gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) {
  const int64_t size = a.dim() ? a.size(dim) : 1;
  const int64_t sd = a.dim() ? a.stride(dim) : 0;
  MG_DISPATCH_ALL(a.dtype(), "gather", [&] {
    using T = scalar_t;
    const T* pa = static_cast<const T*>(a.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    MG_DISPATCH_INDEX(index.dtype(), "gather", [&] {
      using I = scalar_t;
      const I* pi = static_cast<const I*>(index.raw_data());
      strided_loop<3>(index.sizes(), {out.strides(), index.strides(), strides_without(a, dim)},
                      [&](auto off, auto st, int64_t n) {
                        for (int64_t i = 0; i < n; ++i) {
                          const int64_t j = checked(pi[off[1] + i * st[1]], size, "gather", dim);
                          po[off[0] + i * st[0]] = pa[off[2] + i * st[2] + j * sd];
                        }
                      });
    });
  });
}

template <>
void CpuBackend::scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add) {
  const char* op = add ? "scatter_add_" : "scatter_";
  const int64_t size = self.dim() ? self.size(dim) : 1;
  const int64_t sd = self.dim() ? self.stride(dim) : 0;
  MG_DISPATCH_ALL(self.dtype(), op, [&] {
    using T = scalar_t;
    T* ps = static_cast<T*>(self.raw_data());
    const T* pr = static_cast<const T*>(src.raw_data());
    MG_DISPATCH_INDEX(index.dtype(), op, [&] {
      using I = scalar_t;
      const I* pi = static_cast<const I*>(index.raw_data());
      strided_loop<3>(index.sizes(), {strides_without(self, dim), index.strides(), src.strides()},
                      [&](auto off, auto st, int64_t n) {
                        for (int64_t i = 0; i < n; ++i) {
                          const int64_t j = checked(pi[off[1] + i * st[1]], size, op, dim);
                          T& d = ps[off[0] + i * st[0] + j * sd];
                          const T v = pr[off[2] + i * st[2]];
                          if (add)
                            d = static_cast<T>(static_cast<opmath_t<T>>(d) + static_cast<opmath_t<T>>(v));
                          else
                            d = v;
                        }
                      });
    });
  });
}

template <>
void CpuBackend::index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) {
  std::vector<int64_t> idx = index_values(index);
  const int64_t size = a.dim() ? a.size(dim) : 1;
  if (a.dim() > 0 && a.is_contiguous() && out.is_contiguous()) {
    // Rows of `inner` elements: one memcpy per (outer, index) pair (embedding lookups).
    for (size_t i = 0; i < idx.size(); ++i) checked(idx[i], size, "index_select", dim);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= a.size(d);
    for (int64_t d = dim + 1; d < a.dim(); ++d) inner *= a.size(d);
    const size_t row = static_cast<size_t>(inner) * a.element_size();
    const char* pa = static_cast<const char*>(a.raw_data());
    char* po = static_cast<char*>(out.raw_data());
    const int64_t n = static_cast<int64_t>(idx.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = idx[i];
        std::memcpy(po + (o * n + i) * row, pa + (o * size + j) * row, row);
      }
    return;
  }
  for (size_t i = 0; i < idx.size(); ++i) {
    const int64_t j = checked(idx[i], size, "index_select", dim);
    if (a.dim() == 0) {
      raw::copy_(out, a);
    } else {
      raw::copy_(raw::select(out, dim, static_cast<int64_t>(i)), raw::select(a, dim, j));
    }
  }
}

template <>
void CpuBackend::index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool) {
  // The host reads the indices anyway: they are checked whatever the caller says.
  std::vector<int64_t> idx = index_values(index);
  const int64_t size = self.dim() ? self.size(dim) : 1;
  for (size_t i = 0; i < idx.size(); ++i) checked(idx[i], size, "index_add_", dim);
  for (size_t i = 0; i < idx.size(); ++i) {
    const int64_t j = idx[i];
    if (self.dim() == 0) {
      binary(Binary::Add, self, src, self);
    } else {
      Tensor d = raw::select(self, dim, j);
      binary(Binary::Add, d, raw::select(src, dim, static_cast<int64_t>(i)), d);
    }
  }
}

}  // namespace mg::kernels
