// Reductions: the backward of each spreads the gradient back over the reduced dims.
#include <algorithm>

#include "autograd/op_support.h"

namespace mg {

namespace {
// Which dims of a `shape` tensor a reduction over `dims` removes (empty dims = all).
std::vector<bool> reduced_mask(const Shape& shape, const std::vector<int64_t>& dims, const char* op) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0) return {};
  std::vector<bool> mask(nd, dims.empty());
  for (int64_t d : dims) mask[wrap_dim(d, nd, op)] = true;
  return mask;
}

// The input's shape with reduced dims set to 1 (the keepdim shape).
Shape keepdim_shape(const Shape& shape, const std::vector<bool>& mask) {
  Shape s = shape;
  for (size_t i = 0; i < s.size(); ++i)
    if (mask[i]) s[i] = 1;
  return s;
}

int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i)
    if (mask[i]) n *= shape[i];
  return n;
}

// A reduced gradient viewed with the reduced dims kept as size 1 (broadcastable to the input).
Tensor keep(const Tensor& g, const Shape& keep_shape) {
  return g.sizes() == keep_shape ? g : raw::reshape(g, keep_shape);
}
}  // namespace

namespace {
Tensor sum_math(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::sum(a, dims, keepdim);
  if (any_requires_grad({a})) {
    Shape ks = keepdim_shape(a.sizes(), reduced_mask(a.sizes(), dims, "sum"));
    record("sum", {a}, out,
           [shape = a.sizes(), ks](const Grads& g) { return Grads{raw::expand(keep(g[0], ks), shape)}; });
  }
  return out;
}
}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return around(policy::sum, sum_math, a, dims, keepdim);
}

namespace {
Tensor mean_math(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::mean(a, dims, keepdim);
  if (any_requires_grad({a})) {
    auto mask = reduced_mask(a.sizes(), dims, "mean");
    const double n = static_cast<double>(reduced_count(a.sizes(), mask));
    record("mean", {a}, out, [shape = a.sizes(), ks = keepdim_shape(a.sizes(), mask), n](const Grads& g) {
      Tensor gs = kernels::mul_scalar(keep(g[0], ks), 1.0 / n);
      return Grads{raw::expand(gs, shape)};
    });
  }
  return out;
}
}  // namespace

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return around(policy::mean, mean_math, a, dims, keepdim);
}

Tensor max(const Tensor& a, int64_t dim, bool keepdim) {
  auto [values, indices] = kernels::max(a, dim, keepdim);
  if (any_requires_grad({a})) {
    const int64_t d = wrap_dim(dim, std::max<int64_t>(a.dim(), 1), "max");
    Shape ks = a.sizes();
    if (!ks.empty()) ks[d] = 1;
    // The gradient goes to the argmax of each row.
    record("max", {a}, values, [shape = a.sizes(), ks, d, idx = SavedTensor(indices, "max")](const Grads& g) {
      if (shape.empty()) return Grads{g[0]};
      Tensor z = zeros(shape, {g[0].dtype(), g[0].device()});
      kernels::scatter_(z, d, keep(idx.unpack(), ks), keep(g[0], ks));
      return Grads{z};
    });
  }
  return values;
}

Tensor amax(const Tensor& a) {
  Tensor out = kernels::max_all(a);
  if (any_requires_grad({a}))
    // Ties share the gradient evenly (PyTorch's amax convention).
    record("amax", {a}, out, [sa = SavedTensor(a, "amax"), so = SavedTensor(out, "amax")](const Grads& g) {
      Tensor x = sa.unpack();
      Tensor m = kernels::cast(kernels::binary(kernels::Binary::Eq, x, so.unpack()), g[0].dtype());
      Tensor share = kernels::div(g[0], kernels::sum(m));
      return Grads{kernels::mul(m, share)};
    });
  return out;
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) { return kernels::argmax(a, dim, keepdim); }

namespace {
Tensor var_math(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  Tensor out = kernels::var(a, dims, correction, keepdim);
  if (any_requires_grad({a})) {
    auto mask = reduced_mask(a.sizes(), dims, "var");
    const double n = static_cast<double>(reduced_count(a.sizes(), mask));
    // d var / dx = 2 (x - mean) / (N - correction)
    record("var", {a}, out,
           [dims, ks = keepdim_shape(a.sizes(), mask), n, correction, sa = SavedTensor(a, "var")](const Grads& g) {
             Tensor x = sa.unpack();
             Tensor centered = kernels::sub(x, kernels::mean(x, dims, true));
             Tensor gs = kernels::mul_scalar(keep(g[0], ks), 2.0 / (n - static_cast<double>(correction)));
             return Grads{kernels::mul(centered, gs)};
           });
  }
  return out;
}
}  // namespace

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return around(policy::var, var_math, a, dims, correction, keepdim);
}

}  // namespace mg
