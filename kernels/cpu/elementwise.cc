// Elementwise CPU kernels: unary/binary maps over strided operands, with a flat loop for
// the contiguous case and unit-stride / scalar-operand row loops the compiler vectorizes.
#include <cmath>
#include <type_traits>

#include "core/philox.h"
#include "core/strided_loop.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// t holds out's elements in out's memory order, out dense (both contiguous, or both
// channels-last): one flat loop over both.
bool flat(const Tensor& t, const Tensor& out) {
  return t.sizes() == out.sizes() && (out.is_contiguous() ? t.is_contiguous() : same_dense_layout(out, t));
}

// out[i] = f(a[i])
template <class O, class A, class F>
void map1(const Tensor& a, const Tensor& out, F f) {
  O* po = ptr<O>(out);
  const A* pa = ptr<const A>(a);
  if (out.is_dense() && flat(a, out)) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i]);
    return;
  }
  strided_loop<2>(out.sizes(), {out.strides(), a.strides()}, [&](auto off, auto st, int64_t n) {
    O* o = po + off[0];
    const A* x = pa + off[1];
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]]);
    }
  });
}

// out[i] = f(a[i], b[i])
template <class O, class A, class B, class F>
void map2(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  O* po = ptr<O>(out);
  const A* pa = ptr<const A>(a);
  const B* pb = ptr<const B>(b);
  if (out.is_dense() && flat(a, out) && flat(b, out)) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return;
  }
  strided_loop<3>(out.sizes(), {out.strides(), a.strides(), b.strides()}, [&](auto off, auto st, int64_t n) {
    O* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
      const B yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
      const A xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
    }
  });
}

// out[i] = f(a[i], b[i], c[i])
template <class O, class A, class B, class C, class F>
void map3(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& out, F f) {
  O* po = ptr<O>(out);
  const A* pa = ptr<const A>(a);
  const B* pb = ptr<const B>(b);
  const C* pc = ptr<const C>(c);
  if (out.is_dense() && flat(a, out) && flat(b, out) && flat(c, out)) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i], pc[i]);
    return;
  }
  strided_loop<4>(out.sizes(), {out.strides(), a.strides(), b.strides(), c.strides()},
                  [&](auto off, auto st, int64_t n) {
                    O* o = po + off[0];
                    const A* x = pa + off[1];
                    const B* y = pb + off[2];
                    const C* z = pc + off[3];
                    for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]], z[i * st[3]]);
                  });
}

template <class M>
bool isnan_(M v) {
  if constexpr (std::is_floating_point_v<M>)
    return std::isnan(v);
  else
    return false;
}

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kTanhK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kTanhC = 0.044715;

template <class T>
void unary_t(Unary op, const Tensor& a, const Tensor& out) {
  using M = opmath_t<T>;
  auto run = [&](auto f) { map1<T, T>(a, out, [f](T x) { return static_cast<T>(f(static_cast<M>(x))); }); };
  if constexpr (std::is_floating_point_v<M>) {
    switch (op) {
      case Unary::Exp:
        return run([](M x) { return std::exp(x); });
      case Unary::Log:
        return run([](M x) { return std::log(x); });
      case Unary::Sqrt:
        return run([](M x) { return std::sqrt(x); });
      case Unary::Rsqrt:
        return run([](M x) { return M(1) / std::sqrt(x); });
      case Unary::Gelu:
        return run([](M x) { return M(0.5) * x * (M(1) + std::erf(x * M(kSqrt1_2))); });
      case Unary::GeluTanh:
        return run([](M x) { return M(0.5) * x * (M(1) + std::tanh(M(kTanhK) * (x + M(kTanhC) * x * x * x))); });
      case Unary::Sigmoid:
        return run([](M x) { return M(1) / (M(1) + std::exp(-x)); });
      case Unary::Tanh:
        return run([](M x) { return std::tanh(x); });
      case Unary::Reciprocal:
        return run([](M x) { return M(1) / x; });
      case Unary::Silu:
        return run([](M x) { return x / (M(1) + std::exp(-x)); });
      case Unary::Softplus:
        return run([](M x) { return x > M(20) ? x : std::log1p(std::exp(x)); });
      case Unary::Abs:
        return run([](M x) { return std::abs(x); });
      default:
        break;
    }
  } else {
    if (op == Unary::Abs) {
      if constexpr (std::is_signed_v<M>)
        return run([](M x) { return x < 0 ? M(-x) : x; });
      else
        return run([](M x) { return x; });
    }
  }
  switch (op) {
    case Unary::Neg:
      return run([](M x) { return -x; });
    case Unary::Relu:
      return run([](M x) { return x < M(0) ? M(0) : x; });  // NaN stays NaN
    case Unary::Sign:
      return run([](M x) { return M((M(0) < x) - (x < M(0))); });
    case Unary::Square:
      return run([](M x) { return x * x; });
    default:
      MG_THROW(DTypeError, "unary: op not supported for dtype ", a.dtype());
  }
}

template <class T>
void binary_t(Binary op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using M = opmath_t<T>;
  auto run = [&](auto f) {
    map2<T, T, T>(a, b, out, [f](T x, T y) { return static_cast<T>(f(static_cast<M>(x), static_cast<M>(y))); });
  };
  auto cmp = [&](auto f) {
    map2<bool, T, T>(a, b, out, [f](T x, T y) { return static_cast<bool>(f(static_cast<M>(x), static_cast<M>(y))); });
  };
  switch (op) {
    case Binary::Add:
      return run([](M x, M y) { return x + y; });
    case Binary::Sub:
      return run([](M x, M y) { return x - y; });
    case Binary::Mul:
      return run([](M x, M y) { return x * y; });
    case Binary::Div:
      if constexpr (std::is_floating_point_v<M>) return run([](M x, M y) { return x / y; });
      break;
    case Binary::Pow:
      if constexpr (std::is_floating_point_v<M>)
        return run([](M x, M y) { return std::pow(x, y); });
      else
        return run([](M x, M y) { return static_cast<M>(std::pow(static_cast<double>(x), static_cast<double>(y))); });
    case Binary::Maximum:
      return run([](M x, M y) { return isnan_(x) ? x : (isnan_(y) ? y : (x > y ? x : y)); });
    case Binary::Minimum:
      return run([](M x, M y) { return isnan_(x) ? x : (isnan_(y) ? y : (x < y ? x : y)); });
    case Binary::Eq:
      return cmp([](M x, M y) { return x == y; });
    case Binary::Ne:
      return cmp([](M x, M y) { return x != y; });
    case Binary::Lt:
      return cmp([](M x, M y) { return x < y; });
    case Binary::Le:
      return cmp([](M x, M y) { return x <= y; });
    case Binary::Gt:
      return cmp([](M x, M y) { return x > y; });
    case Binary::Ge:
      return cmp([](M x, M y) { return x >= y; });
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<M>) {
    switch (op) {
      case Binary::ReluBackward:
        return run([](M g, M x) { return x > M(0) ? g : M(0); });
      case Binary::GeluBackward:
        return run([](M g, M x) {
          const M cdf = M(0.5) * (M(1) + std::erf(x * M(kSqrt1_2)));
          const M pdf = M(kInvSqrt2Pi) * std::exp(M(-0.5) * x * x);
          return g * (cdf + x * pdf);
        });
      case Binary::GeluTanhBackward:
        return run([](M g, M x) {
          const M t = std::tanh(M(kTanhK) * (x + M(kTanhC) * x * x * x));
          const M d = M(0.5) * (M(1) + t) + M(0.5) * x * (M(1) - t * t) * M(kTanhK) * (M(1) + M(3 * kTanhC) * x * x);
          return g * d;
        });
      case Binary::SigmoidBackward:
        return run([](M g, M y) { return g * y * (M(1) - y); });
      case Binary::TanhBackward:
        return run([](M g, M y) { return g * (M(1) - y * y); });
      case Binary::SiluBackward:
        return run([](M g, M x) {
          const M s = M(1) / (M(1) + std::exp(-x));
          return g * s * (M(1) + x * (M(1) - s));
        });
      case Binary::SoftplusBackward:
        return run([](M g, M x) { return x > M(20) ? g : g / (M(1) + std::exp(-x)); });
      default:
        break;
    }
  }
  MG_THROW(DTypeError, "binary: op not supported for dtype ", a.dtype());
}

}  // namespace

template <>
void CpuBackend::unary(Unary op, const Tensor& a, const Tensor& out) {
  MG_DISPATCH_ALL(a.dtype(), "unary", [&] { unary_t<scalar_t>(op, a, out); });
}

template <>
void CpuBackend::binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& out) {
  MG_DISPATCH_ALL(a.dtype(), "binary", [&] { binary_t<scalar_t>(op, a, b, out); });
}

template <>
void CpuBackend::clamp(const Tensor& a, double lo, double hi, const Tensor& out) {
  MG_DISPATCH_ALL(a.dtype(), "clamp", [&] {
    using T = scalar_t;
    using M = opmath_t<T>;
    if constexpr (std::is_floating_point_v<M>) {
      const M l = static_cast<M>(lo), h = static_cast<M>(hi);
      map1<T, T>(a, out, [l, h](T xv) {
        M v = static_cast<M>(xv);
        v = v < l ? l : v;
        return static_cast<T>(v > h ? h : v);
      });
    } else {
      // Compare in double so infinite bounds never get converted to an integer.
      map1<T, T>(a, out, [lo, hi](T xv) {
        double v = static_cast<double>(xv);
        v = v < lo ? lo : v;
        return static_cast<T>(v > hi ? hi : v);
      });
    }
  });
}

template <>
void CpuBackend::clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi, const Tensor& out) {
  MG_DISPATCH_ALL(grad.dtype(), "clamp_backward", [&] {
    using T = scalar_t;
    map2<T, T, T>(grad, x, out, [lo, hi](T g, T xv) {
      const double v = static_cast<double>(static_cast<opmath_t<T>>(xv));
      return (v >= lo && v <= hi) ? g : static_cast<T>(static_cast<opmath_t<T>>(0));
    });
  });
}

template <>
void CpuBackend::axpby(const Tensor& a, double alpha, const Tensor& b, double beta, const Tensor& out) {
  MG_DISPATCH_ALL(out.dtype(), "axpby", [&] {
    using T = scalar_t;
    using M = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, opmath_t<T>, double>;
    const M al = static_cast<M>(alpha), be = static_cast<M>(beta);
    map2<T, T, T>(a, b, out, [al, be](T x, T y) {
      return static_cast<T>(static_cast<M>(static_cast<opmath_t<T>>(x)) * al +
                            static_cast<M>(static_cast<opmath_t<T>>(y)) * be);
    });
  });
}

template <>
void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  MG_DISPATCH_ALL(out.dtype(), "where", [&] {
    using T = scalar_t;
    map3<T, bool, T, T>(cond, a, b, out, [](bool c, T x, T y) { return c ? x : y; });
  });
}

// ---- bias + dropout + residual: element i's number is word i % 4 of Philox block base + i / 4,
// as in a Bernoulli fill (core/random.cc), so one block serves four elements.

namespace {
// `f(i, keep_i)` for i in [0, n), drawing each Philox block once.
template <class F>
void for_each_draw(const DropoutDraw& d, int64_t n, F f) {
  for (int64_t g = 0; g * 4 < n; ++g) {
    uint32_t r[4];
    philox4x32(d.base + static_cast<uint64_t>(g), 0, d.seed, r);
    for (int64_t j = 0; j < 4 && g * 4 + j < n; ++j) f(g * 4 + j, (r[j] >> 8) < d.keep_below);
  }
}
}  // namespace

template <>
void CpuBackend::bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, const DropoutDraw& d,
                                  const Tensor& out, const Tensor& keep) {
  const int64_t n = branch.numel(), cols = branch.size(-1);
  bool* pk = ptr<bool>(keep);
  MG_DISPATCH_FLOAT(branch.dtype(), "bias_dropout_add", [&] {
    using B = scalar_t;
    using M = opmath_t<B>;
    const B* pb = ptr<const B>(branch);
    const B* pbias = bias.defined() ? ptr<const B>(bias) : nullptr;
    const M scale = static_cast<M>(d.scale), zero = static_cast<M>(0);
    auto run = [&](auto* po, const auto* px) {
      using O = std::remove_const_t<std::remove_pointer_t<decltype(po)>>;
      for_each_draw(d, n, [&](int64_t i, bool k) {
        M v = static_cast<M>(pb[i]);
        if (pbias) v = v + static_cast<M>(pbias[i % cols]);
        v = v * (k ? scale : zero);  // a product, as dropout's mul: a dropped NaN stays NaN
        if (px) v = static_cast<M>(static_cast<opmath_t<O>>(px[i])) + v;
        po[i] = static_cast<O>(v);
        pk[i] = k;
      });
    };
    if (out.dtype() == branch.dtype())
      run(ptr<B>(out), x.defined() ? ptr<const B>(x) : static_cast<const B*>(nullptr));
    else
      run(ptr<float>(out), x.defined() ? ptr<const float>(x) : static_cast<const float*>(nullptr));
  });
}

template <>
void CpuBackend::dropout_backward(const Tensor& grad, const Tensor& keep, double scale, const Tensor& out) {
  const int64_t n = grad.numel();
  const bool* pk = ptr<const bool>(keep);
  MG_DISPATCH_FLOAT(out.dtype(), "dropout_backward", [&] {
    using O = scalar_t;
    using M = opmath_t<O>;
    const M s = static_cast<M>(scale), zero = static_cast<M>(0);
    auto run = [&](const auto* pg) {
      using G = std::remove_const_t<std::remove_pointer_t<decltype(pg)>>;
      O* po = ptr<O>(out);
      for (int64_t i = 0; i < n; ++i)
        po[i] = static_cast<O>(static_cast<M>(static_cast<opmath_t<G>>(pg[i])) * (pk[i] ? s : zero));
    };
    if (grad.dtype() == out.dtype())
      run(ptr<const O>(grad));
    else
      run(ptr<const float>(grad));
  });
}

}  // namespace mg::kernels
