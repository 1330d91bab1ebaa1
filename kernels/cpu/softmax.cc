// Softmax and log-softmax along one dim on the CPU, numerically stable (the row max is
// subtracted before exp), computed in at least f32; their backward formulas.
#include <cmath>
#include <limits>
#include <vector>

#include "core/strided_loop.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

// Calls f(offsets, n_rows_in_chunk, row_strides) for every row along `dim`: the outer
// iteration runs over all other dims; each row has size K and per-operand stride sk[i].
template <size_t N, class F>
void for_each_row(const std::array<const Tensor*, N>& ts, int64_t dim, F f) {
  const Tensor& t0 = *ts[0];
  Shape outer = t0.sizes();
  std::array<Shape, N> st;
  std::array<int64_t, N> sk{};
  int64_t K = 1;
  if (t0.dim() > 0) {
    K = outer[dim];
    outer[dim] = 1;
    for (size_t i = 0; i < N; ++i) sk[i] = ts[i]->stride(dim);
  }
  for (size_t i = 0; i < N; ++i) st[i] = ts[i]->strides();
  if (K == 0) return;
  strided_loop<N>(outer, st, [&](auto off, auto inner, int64_t n) {
    for (int64_t r = 0; r < n; ++r) {
      std::array<int64_t, N> o;
      for (size_t i = 0; i < N; ++i) o[i] = off[i] + r * inner[i];
      f(o, K, sk);
    }
  });
}

template <class T>
void softmax_t(const Tensor& a, int64_t dim, bool log, const Tensor& out) {
  using M = opmath_t<T>;  // float for f32/f16/bf16, double for f64
  const T* pa = static_cast<const T*>(a.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  std::vector<M> buf;
  for_each_row<2>({&a, &out}, dim, [&](auto o, int64_t K, auto sk) {
    const T* x = pa + o[0];
    T* y = po + o[1];
    buf.resize(K);
    for (int64_t j = 0; j < K; ++j) buf[j] = static_cast<M>(x[j * sk[0]]);
    M mx = -std::numeric_limits<M>::infinity();
    for (int64_t j = 0; j < K; ++j) mx = buf[j] > mx ? buf[j] : mx;
    // A row of all -inf has no finite max; subtracting 0 keeps exp(-inf) = 0 (NaN result, like PyTorch).
    if (std::isinf(mx)) mx = mx > 0 ? mx : M(0);
    M s = 0;
    if (log) {
      for (int64_t j = 0; j < K; ++j) s += std::exp(buf[j] - mx);
      // (x - max) - log(s): subtracting the max first keeps precision for large logits.
      const M ls = std::log(s);
      for (int64_t j = 0; j < K; ++j) y[j * sk[1]] = static_cast<T>((buf[j] - mx) - ls);
    } else {
      for (int64_t j = 0; j < K; ++j) {
        buf[j] = std::exp(buf[j] - mx);
        s += buf[j];
      }
      const M inv = M(1) / s;
      for (int64_t j = 0; j < K; ++j) y[j * sk[1]] = static_cast<T>(buf[j] * inv);
    }
  });
}

template <class T>
void softmax_backward_t(const Tensor& grad, const Tensor& yt, int64_t dim, bool log, const Tensor& out) {
  using M = opmath_t<T>;
  const T* pg = static_cast<const T*>(grad.raw_data());
  const T* py = static_cast<const T*>(yt.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  for_each_row<3>({&grad, &yt, &out}, dim, [&](auto o, int64_t K, auto sk) {
    const T* g = pg + o[0];
    const T* y = py + o[1];
    T* r = po + o[2];
    M s = 0;
    if (log) {
      // grad_in = g - exp(y) * sum(g)
      for (int64_t j = 0; j < K; ++j) s += static_cast<M>(g[j * sk[0]]);
      for (int64_t j = 0; j < K; ++j)
        r[j * sk[2]] = static_cast<T>(static_cast<M>(g[j * sk[0]]) - std::exp(static_cast<M>(y[j * sk[1]])) * s);
    } else {
      // grad_in = y * (g - sum(g * y))
      for (int64_t j = 0; j < K; ++j) s += static_cast<M>(g[j * sk[0]]) * static_cast<M>(y[j * sk[1]]);
      for (int64_t j = 0; j < K; ++j)
        r[j * sk[2]] = static_cast<T>(static_cast<M>(y[j * sk[1]]) * (static_cast<M>(g[j * sk[0]]) - s));
    }
  });
}

}  // namespace

template <>
void CpuBackend::softmax(const Tensor& a, int64_t dim, bool log, const Tensor& out) {
  MG_DISPATCH_FLOAT(a.dtype(), log ? "log_softmax" : "softmax", [&] { softmax_t<scalar_t>(a, dim, log, out); });
}

template <>
void CpuBackend::softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const Tensor& out) {
  MG_DISPATCH_FLOAT(y.dtype(), log ? "log_softmax_backward" : "softmax_backward",
                    [&] { softmax_backward_t<scalar_t>(grad, y, dim, log, out); });
}

}  // namespace mg::kernels
