// Validation and dispatch for kernels/transformer_ops.h. CPU tensors run the row loop in
// cpu/layernorm.cc, CUDA tensors the fused kernels of kernels/cuda/layernorm.cu (when built
// with MG_WITH_CUDA_NN_OPS); any other device runs the composed path (generic kernels that
// exist on every backend), which is also the loop kernel's test reference. Flash attention
// exists on CUDA only (kernels/cuda/attention.cu); its reference is mg::sdpa_reference.
#include "kernels/transformer_ops.h"

#include <cmath>

#include "kernels/ops.h"

#if defined(MG_WITH_CUDA) && defined(MG_WITH_CUDA_NN_OPS)
#include "kernels/cuda/cuda_nn_ops.h"
#define MG_LN_HAS_CUDA 1
#define MG_LN_KERNEL(DEV, FN, ...)                             \
  do {                                                         \
    if ((DEV).is_cuda()) ::mg::kernels::cuda::FN(__VA_ARGS__); \
    else ::mg::kernels::cpu::FN(__VA_ARGS__);                  \
  } while (0)
#else
#define MG_LN_HAS_CUDA 0
#define MG_LN_KERNEL(DEV, FN, ...) ::mg::kernels::cpu::FN(__VA_ARGS__)
#endif

namespace mg::kernels {
namespace {

// Devices with a layer-norm kernel of their own (the rest take the composed path).
bool has_kernel(Device d) { return d.is_cpu() || (MG_LN_HAS_CUDA && d.is_cuda()); }

struct LnShape {
  int64_t rows = 0, n = 1;  // x viewed as [rows, n]
  Shape stats;              // x.shape[:-k] + [1] * k
};

void check_same_device(const char* op, const Tensor& x, const Tensor& t, const char* what) {
  if (t.defined())
    MG_CHECK(t.device() == x.device(), DeviceError, op, ": ", what, " is on ", t.device(), " but the input is on ",
             x.device());
}

LnShape check_layer_norm(const char* op, const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias) {
  MG_CHECK(x.defined(), ValueError, op, ": got an undefined input");
  MG_CHECK(is_floating(x.dtype()), DTypeError, op, ": input must be floating, got ", x.dtype());
  MG_CHECK(!ns.empty(), ValueError, op, ": normalized_shape must have at least one dim, got []");
  const int64_t k = static_cast<int64_t>(ns.size());
  Shape tail;
  if (k <= x.dim()) tail.assign(x.sizes().end() - k, x.sizes().end());
  MG_CHECK(k <= x.dim() && tail == ns, ShapeError, op, ": normalized_shape ", shape_str(ns),
           " must equal the input's last ", k, " dims, but the input has shape ", shape_str(x.sizes()));
  auto check_param = [&](const Tensor& p, const char* what) {
    if (!p.defined()) return;
    MG_CHECK(p.sizes() == ns, ShapeError, op, ": ", what, " has shape ", shape_str(p.sizes()),
             ", expected normalized_shape ", shape_str(ns));
    MG_CHECK(is_floating(p.dtype()), DTypeError, op, ": ", what, " must be floating, got ", p.dtype());
    check_same_device(op, x, p, what);
  };
  check_param(weight, "weight");
  check_param(bias, "bias");
  LnShape s;
  s.n = shape_numel(ns);
  s.rows = s.n == 0 ? 0 : x.numel() / s.n;
  s.stats = x.sizes();
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) s.stats[d] = 1;
  return s;
}

// t as a contiguous [rows, n] (or [n]) tensor of dtype dt.
Tensor as_rows(const Tensor& t, DType dt, const Shape& shape) {
  Tensor c = t.dtype() == dt ? t : raw::to_dtype(t, dt);
  return raw::view(raw::contiguous(c), shape);
}

void check_eps(double eps) {
  MG_CHECK(eps >= 0.0 && std::isfinite(eps), ValueError, "layer_norm: eps must be finite and >= 0, got ", eps);
}

void check_stats(const char* op, const LnShape& s, const Tensor& x, const Tensor& mean, const Tensor& rstd) {
  const DType st = layer_norm_stats_dtype(x.dtype());
  for (const Tensor* t : {&mean, &rstd}) {
    MG_CHECK(t->defined() && t->numel() == s.rows, ShapeError, op, ": mean/rstd must have ", s.rows,
             " elements (shape ", shape_str(s.stats), "), got ",
             t->defined() ? shape_str(t->sizes()) : std::string("undefined"));
    MG_CHECK(t->dtype() == st, DTypeError, op, ": mean/rstd must be ", st, " for ", x.dtype(), " input, got ",
             t->dtype());
    check_same_device(op, x, *t, "mean/rstd");
  }
}

}  // namespace

DType layer_norm_stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward(const Tensor& x, const Shape& normalized_shape,
                                                      const Tensor& weight, const Tensor& bias, double eps) {
  const LnShape s = check_layer_norm("layer_norm", x, normalized_shape, weight, bias);
  check_eps(eps);
  if (!has_kernel(x.device())) return layer_norm_forward_composed(x, normalized_shape, weight, bias, eps);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor out = empty({s.rows, s.n}, {x.dtype(), x.device()});
  Tensor mean = empty({s.rows}, {st, x.device()});
  Tensor rstd = empty({s.rows}, {st, x.device()});
  if (s.rows > 0) {
    Tensor w = weight.defined() ? as_rows(weight, x.dtype(), {s.n}) : Tensor();
    Tensor b = bias.defined() ? as_rows(bias, x.dtype(), {s.n}) : Tensor();
    MG_LN_KERNEL(x.device(), layer_norm_forward, as_rows(x, x.dtype(), {s.rows, s.n}), w, b, eps, out, mean, rstd);
  }
  return {raw::view(out, x.sizes()), raw::view(mean, s.stats), raw::view(rstd, s.stats)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad_out, const Tensor& x,
                                                       const Shape& normalized_shape, const Tensor& mean,
                                                       const Tensor& rstd, const Tensor& weight,
                                                       std::array<bool, 3> mask) {
  const char* op = "layer_norm_backward";
  const LnShape s = check_layer_norm(op, x, normalized_shape, weight, Tensor());
  MG_CHECK(grad_out.defined() && grad_out.sizes() == x.sizes(), ShapeError, op, ": grad_out shape ",
           grad_out.defined() ? shape_str(grad_out.sizes()) : std::string("undefined"), " does not match input shape ",
           shape_str(x.sizes()));
  check_same_device(op, x, grad_out, "grad_out");
  check_stats(op, s, x, mean, rstd);
  if (!has_kernel(x.device()))
    return layer_norm_backward_composed(grad_out, x, normalized_shape, mean, rstd, weight, mask);
  const TensorOptions o{x.dtype(), x.device()};
  Tensor gx = mask[0] ? empty({s.rows, s.n}, o) : Tensor();
  Tensor gw = mask[1] ? zeros({s.n}, o) : Tensor();
  Tensor gb = mask[2] ? zeros({s.n}, o) : Tensor();
  if (s.rows > 0 && (mask[0] || mask[1] || mask[2])) {
    const DType st = layer_norm_stats_dtype(x.dtype());
    Tensor w = weight.defined() ? as_rows(weight, x.dtype(), {s.n}) : Tensor();
    MG_LN_KERNEL(x.device(), layer_norm_backward, as_rows(grad_out, x.dtype(), {s.rows, s.n}),
                 as_rows(x, x.dtype(), {s.rows, s.n}), as_rows(mean, st, {s.rows}), as_rows(rstd, st, {s.rows}), w, gx,
                 gw, gb);
  }
  return {gx.defined() ? raw::view(gx, x.sizes()) : gx, gw.defined() ? raw::view(gw, normalized_shape) : gw,
          gb.defined() ? raw::view(gb, normalized_shape) : gb};
}

// ---------------------------------------------------------------- flash attention

namespace {

#if MG_LN_HAS_CUDA
static_assert(kFlashAttentionMaxHeadDim == cuda::kFlashMaxHeadDim);
#endif

struct FlashShape {
  Shape lead;  // the leading dims, flattened to bh
  int64_t bh = 1, L = 0, S = 0, E = 0;
};

// Fails with an error naming `op` and the values, or (op == nullptr) just returns false.
#define MG_FLASH_REQUIRE(cond, ErrorType, ...)      \
  do {                                              \
    if (!(cond)) {                                  \
      if (!op) return false;                        \
      MG_THROW(ErrorType, op, ": ", __VA_ARGS__);   \
    }                                               \
  } while (0)

bool check_flash(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, FlashShape* shape) {
  MG_FLASH_REQUIRE(q.defined() && k.defined() && v.defined(), ValueError, "got an undefined tensor");
  MG_FLASH_REQUIRE(q.device() == k.device() && q.device() == v.device(), DeviceError, "query, key and value are on ",
                   q.device(), ", ", k.device(), " and ", v.device());
  MG_FLASH_REQUIRE(q.is_cuda(), DeviceError, "runs on CUDA only, got tensors on ", q.device(),
                   " (the CPU path is sdpa_reference)");
  MG_FLASH_REQUIRE(MG_LN_HAS_CUDA, DeviceError, "this build has no CUDA attention kernels");
  MG_FLASH_REQUIRE(q.dtype() == k.dtype() && q.dtype() == v.dtype(), DTypeError,
                   "query, key and value must share one dtype, got ", q.dtype(), ", ", k.dtype(), " and ", v.dtype());
  MG_FLASH_REQUIRE(q.dtype() == DType::f32 || q.dtype() == DType::f16 || q.dtype() == DType::bf16, DTypeError,
                   "expected f32, f16 or bf16, got ", q.dtype());
  MG_FLASH_REQUIRE(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError,
                   "query, key and value must have one rank >= 2 ([..., L, E], [..., S, E], [..., S, E]), got ",
                   shape_str(q.sizes()), ", ", shape_str(k.sizes()), " and ", shape_str(v.sizes()));
  const int64_t E = q.size(-1);
  MG_FLASH_REQUIRE(k.size(-1) == E && v.size(-1) == E, ShapeError,
                   "query, key and value must share the head dim, got ", shape_str(q.sizes()), ", ",
                   shape_str(k.sizes()), " and ", shape_str(v.sizes()));
  MG_FLASH_REQUIRE(E >= 1 && E <= kFlashAttentionMaxHeadDim, ShapeError, "head dim must be in [1, ",
                   kFlashAttentionMaxHeadDim, "], got ", E);
  MG_FLASH_REQUIRE(k.size(-2) == v.size(-2), ShapeError, "key has ", k.size(-2), " positions but value has ",
                   v.size(-2));
  MG_FLASH_REQUIRE(k.size(-2) >= 1, ShapeError, "needs at least one key position, got key ", shape_str(k.sizes()));
  FlashShape s;
  for (int64_t d = 0; d < q.dim() - 2; ++d) {
    MG_FLASH_REQUIRE(q.size(d) == k.size(d) && q.size(d) == v.size(d), ShapeError,
                     "query, key and value must have the same batch/head dims, got ", shape_str(q.sizes()), ", ",
                     shape_str(k.sizes()), " and ", shape_str(v.sizes()), " (dim ", d, ")");
    s.lead.push_back(q.size(d));
    s.bh *= q.size(d);
  }
  s.L = q.size(-2), s.S = k.size(-2), s.E = E;
  if (shape) *shape = s;
  return true;
}

#undef MG_FLASH_REQUIRE

double flash_scale(const char* op, const FlashShape& s, std::optional<double> scale) {
  MG_CHECK(!scale || std::isfinite(*scale), ValueError, op, ": scale must be finite, got ", scale.value_or(0.0));
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.E));
}

// t as a contiguous [bh, n, e] tensor of dtype dt (a copy only when it is not one already).
Tensor as_heads(const Tensor& t, DType dt, int64_t bh, int64_t n, int64_t e) {
  return as_rows(t, dt, {bh, n, e});
}

Shape with_tail(Shape lead, std::initializer_list<int64_t> tail) {
  lead.insert(lead.end(), tail);
  return lead;
}

}  // namespace

bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return check_flash(nullptr, q, k, v, nullptr);
}

std::tuple<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> scale) {
  const char* op = "flash_attention_forward";
  FlashShape s;
  check_flash(op, q, k, v, &s);
  const double sc = flash_scale(op, s, scale);
  const TensorOptions o{q.dtype(), q.device()};
  Tensor out = empty({s.bh, s.L, s.E}, o);
  Tensor lse = empty({s.bh, s.L}, {DType::f32, q.device()});
#if MG_LN_HAS_CUDA
  cuda::flash_attention_forward(as_heads(q, q.dtype(), s.bh, s.L, s.E), as_heads(k, q.dtype(), s.bh, s.S, s.E),
                                as_heads(v, q.dtype(), s.bh, s.S, s.E), causal, sc, out, lse);
#else
  (void)causal, (void)sc;
#endif
  return {raw::view(out, with_tail(s.lead, {s.L, s.E})), raw::view(lse, with_tail(s.lead, {s.L}))};
}

std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out,
                                                            const Tensor& logsumexp, bool causal,
                                                            std::optional<double> scale) {
  const char* op = "flash_attention_backward";
  FlashShape s;
  check_flash(op, q, k, v, &s);
  const double sc = flash_scale(op, s, scale);
  const Shape out_shape = with_tail(s.lead, {s.L, s.E}), lse_shape = with_tail(s.lead, {s.L});
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&grad_out, "grad_out"}, {&out, "out"}}) {
    MG_CHECK(t->defined() && t->sizes() == out_shape, ShapeError, op, ": ", what, " must have shape ",
             shape_str(out_shape), ", got ", t->defined() ? shape_str(t->sizes()) : std::string("undefined"));
    check_same_device(op, q, *t, what);
  }
  MG_CHECK(is_floating(grad_out.dtype()), DTypeError, op, ": grad_out must be floating, got ", grad_out.dtype());
  MG_CHECK(out.dtype() == q.dtype(), DTypeError, op, ": out must be ", q.dtype(), " like the query, got ",
           out.dtype());
  MG_CHECK(logsumexp.defined() && logsumexp.sizes() == lse_shape, ShapeError, op, ": logsumexp must have shape ",
           shape_str(lse_shape), ", got ", logsumexp.defined() ? shape_str(logsumexp.sizes()) : std::string("undefined"));
  MG_CHECK(logsumexp.dtype() == DType::f32, DTypeError, op, ": logsumexp must be f32, got ", logsumexp.dtype());
  check_same_device(op, q, logsumexp, "logsumexp");
  const TensorOptions o{q.dtype(), q.device()};
  Tensor gq = empty({s.bh, s.L, s.E}, o), gk = empty({s.bh, s.S, s.E}, o), gv = empty({s.bh, s.S, s.E}, o);
#if MG_LN_HAS_CUDA
  const DType dt = q.dtype();
  cuda::flash_attention_backward(as_heads(grad_out, dt, s.bh, s.L, s.E), as_heads(q, dt, s.bh, s.L, s.E),
                                 as_heads(k, dt, s.bh, s.S, s.E), as_heads(v, dt, s.bh, s.S, s.E),
                                 as_heads(out, dt, s.bh, s.L, s.E), as_rows(logsumexp, DType::f32, {s.bh, s.L}),
                                 causal, sc, gq, gk, gv);
#else
  (void)causal, (void)sc;
#endif
  return {raw::view(gq, out_shape), raw::view(gk, with_tail(s.lead, {s.S, s.E})),
          raw::view(gv, with_tail(s.lead, {s.S, s.E}))};
}

// ---------------------------------------------------------------- composed reference

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_composed(const Tensor& x, const Shape& normalized_shape,
                                                               const Tensor& weight, const Tensor& bias, double eps) {
  const LnShape s = check_layer_norm("layer_norm", x, normalized_shape, weight, bias);
  check_eps(eps);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor xf = as_rows(x, st, {s.rows, s.n});
  Tensor mean = kernels::mean(xf, {1}, true);  // [rows, 1]
  Tensor xc = sub(xf, mean);
  Tensor var = kernels::mean(mul(xc, xc), {1}, true);
  Tensor rstd = unary(Unary::Rsqrt, add_scalar(var, eps));
  Tensor y = mul(xc, rstd);
  if (weight.defined()) y = mul(y, as_rows(weight, st, {s.n}));
  if (bias.defined()) y = add(y, as_rows(bias, st, {s.n}));
  Tensor out = y.dtype() == x.dtype() ? y : cast(y, x.dtype());
  return {raw::view(out, x.sizes()), raw::view(mean, s.stats), raw::view(rstd, s.stats)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_composed(const Tensor& grad_out, const Tensor& x,
                                                                const Shape& normalized_shape, const Tensor& mean,
                                                                const Tensor& rstd, const Tensor& weight,
                                                                std::array<bool, 3> mask) {
  const char* op = "layer_norm_backward";
  const LnShape s = check_layer_norm(op, x, normalized_shape, weight, Tensor());
  check_stats(op, s, x, mean, rstd);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor m = as_rows(mean, st, {s.rows, 1}), r = as_rows(rstd, st, {s.rows, 1});
  Tensor xhat = mul(sub(as_rows(x, st, {s.rows, s.n}), m), r);
  Tensor g = as_rows(grad_out, st, {s.rows, s.n});
  auto back = [&](const Tensor& t, const Shape& shape) {
    return raw::view(t.dtype() == x.dtype() ? raw::contiguous(t) : cast(t, x.dtype()), shape);
  };
  Tensor gx, gw, gb;
  if (mask[0]) {
    Tensor gwt = weight.defined() ? mul(g, as_rows(weight, st, {s.n})) : g;
    Tensor a = kernels::mean(gwt, {1}, true);
    Tensor b = kernels::mean(mul(gwt, xhat), {1}, true);
    gx = back(mul(r, sub(sub(gwt, a), mul(xhat, b))), x.sizes());
  }
  if (mask[1]) gw = back(kernels::sum(mul(g, xhat), {0}), normalized_shape);
  if (mask[2]) gb = back(kernels::sum(g, {0}), normalized_shape);
  return {gx, gw, gb};
}

}  // namespace mg::kernels
