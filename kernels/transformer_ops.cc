// Validation and dispatch for kernels/transformer_ops.h. CPU tensors run the row loop in
// cpu/layer_norm.cc, CUDA tensors the fused kernels of kernels/cuda/layer_norm.cu (when built
// with MG_WITH_CUDA_NN_OPS); any other device runs the composed path (generic kernels that
// exist on every backend), which is also the loop kernel's test reference. Flash attention
// exists on CUDA only (kernels/cuda/attention.cu); its reference is mg::sdpa_reference.
#include "kernels/transformer_ops.h"

#include <cmath>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

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

// t [..., n, e] as a [B, H, n, e] view of its own storage, when its head dim is unit-stride and
// its leading dims fold into two (batch, head) strides; undefined otherwise. This is what lets
// the kernels read q/k/v narrowed and transposed out of a packed [B, T, 3C] projection.
Tensor heads_view(const Tensor& t, int64_t n, int64_t e) {
  if (t.dim() < 2 || (e > 1 && t.stride(-1) != 1)) return Tensor();
  std::vector<std::pair<int64_t, int64_t>> lead;  // (size, stride), outermost first
  for (int64_t d = 0; d < t.dim() - 2; ++d) {
    if (t.size(d) == 1) continue;
    if (!lead.empty() && lead.back().second == t.stride(d) * t.size(d)) {
      lead.back() = {lead.back().first * t.size(d), t.stride(d)};
    } else {
      lead.emplace_back(t.size(d), t.stride(d));
    }
  }
  if (lead.size() > 2) return Tensor();
  while (lead.size() < 2) lead.insert(lead.begin(), {1, 0});
  return raw::as_strided(t, {lead[0].first, lead[1].first, n, e},
                         {lead[0].second, lead[1].second, n > 1 ? t.stride(-2) : e, 1}, t.offset());
}

// The tensor-core kernels move rows 16 bytes (8 half elements) at a time: the first element
// and every row start must be 16-byte aligned (kernels/cuda/attention_tc.h, tc_layout_aligned).
bool tc_aligned(const Tensor& h) {
  if (reinterpret_cast<uintptr_t>(h.raw_data()) % 16 != 0) return false;
  for (int64_t d = 0; d < 3; ++d)
    if (h.stride(d) % 8 != 0) return false;
  return true;
}

// Whether the tensor-core kernels will run (then views must satisfy tc_aligned).
bool uses_tc(DType dt, int64_t e) {
#if MG_LN_HAS_CUDA
  return std::string_view(cuda::flash_attention_kernel(dt, e)) == "tc";
#else
  (void)dt, (void)e;
  return false;
#endif
}

// An input as the kernels' [B, H, n, e] layout of dtype dt: the tensor itself when its strides
// allow, else (another dtype, a non-unit head stride, misaligned for the tensor cores) a
// contiguous copy viewed as [1, bh, n, e].
Tensor heads_in(const Tensor& t, DType dt, int64_t bh, int64_t n, int64_t e, bool tc) {
  if (t.dtype() == dt)
    if (Tensor h = heads_view(t, n, e); h.defined() && (!tc || tc_aligned(h))) return h;
  return raw::view(as_rows(t, dt, {bh, n, e}), {1, bh, n, e});
}

// An output the kernels write: the caller's tensor viewed as [B, H, n, e] when its strides allow,
// else a contiguous scratch that finish() copies into it.
struct HeadsOut {
  Tensor dst, heads;
  HeadsOut(const Tensor& t, int64_t bh, int64_t n, int64_t e, bool tc) : dst(t), heads(heads_view(t, n, e)) {
    if (!heads.defined() || (tc && !tc_aligned(heads)))
      heads = empty({1, bh, n, e}, {t.dtype(), t.device()});
  }
  void finish() const {
    if (heads.storage() != dst.storage()) raw::copy_(dst, raw::view(heads, dst.sizes()));
  }
};

void check_out(const char* op, const Tensor& t, const char* what, const Shape& shape, const Tensor& q) {
  MG_CHECK(t.defined() && t.sizes() == shape, ShapeError, op, ": ", what, " must have shape ", shape_str(shape),
           ", got ", t.defined() ? shape_str(t.sizes()) : std::string("undefined"));
  MG_CHECK(t.dtype() == q.dtype(), DTypeError, op, ": ", what, " must be ", q.dtype(), " like the query, got ",
           t.dtype());
  check_same_device(op, q, t, what);
}

Shape with_tail(Shape lead, std::initializer_list<int64_t> tail) {
  lead.insert(lead.end(), tail);
  return lead;
}

}  // namespace

bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return check_flash(nullptr, q, k, v, nullptr);
}

Tensor flash_attention_forward_out(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, bool causal,
                                   std::optional<double> scale) {
  const char* op = "flash_attention_forward";
  FlashShape s;
  check_flash(op, q, k, v, &s);
  const double sc = flash_scale(op, s, scale);
  check_out(op, out, "out", with_tail(s.lead, {s.L, s.E}), q);
  Tensor lse = empty({s.bh, s.L}, {DType::f32, q.device()});
#if MG_LN_HAS_CUDA
  const DType dt = q.dtype();
  const bool tc = uses_tc(dt, s.E);
  const HeadsOut o(out, s.bh, s.L, s.E, tc);
  cuda::flash_attention_forward(heads_in(q, dt, s.bh, s.L, s.E, tc), heads_in(k, dt, s.bh, s.S, s.E, tc),
                                heads_in(v, dt, s.bh, s.S, s.E, tc), causal, sc, o.heads, lse);
  o.finish();
#else
  (void)causal, (void)sc;
#endif
  return raw::view(lse, with_tail(s.lead, {s.L}));
}

std::tuple<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> scale) {
  FlashShape s;
  check_flash("flash_attention_forward", q, k, v, &s);
  Tensor out = empty(with_tail(s.lead, {s.L, s.E}), {q.dtype(), q.device()});
  Tensor lse = flash_attention_forward_out(q, k, v, out, causal, scale);
  return {out, lse};
}

void flash_attention_backward_out(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& logsumexp, bool causal,
                                  std::optional<double> scale, const Tensor& grad_q, const Tensor& grad_k,
                                  const Tensor& grad_v) {
  const char* op = "flash_attention_backward";
  FlashShape s;
  check_flash(op, q, k, v, &s);
  const double sc = flash_scale(op, s, scale);
  const Shape out_shape = with_tail(s.lead, {s.L, s.E}), kv_shape = with_tail(s.lead, {s.S, s.E}),
              lse_shape = with_tail(s.lead, {s.L});
  MG_CHECK(grad_out.defined() && grad_out.sizes() == out_shape, ShapeError, op, ": grad_out must have shape ",
           shape_str(out_shape), ", got ", grad_out.defined() ? shape_str(grad_out.sizes()) : std::string("undefined"));
  check_same_device(op, q, grad_out, "grad_out");
  MG_CHECK(is_floating(grad_out.dtype()), DTypeError, op, ": grad_out must be floating, got ", grad_out.dtype());
  check_out(op, out, "out", out_shape, q);
  MG_CHECK(logsumexp.defined() && logsumexp.sizes() == lse_shape, ShapeError, op, ": logsumexp must have shape ",
           shape_str(lse_shape), ", got ", logsumexp.defined() ? shape_str(logsumexp.sizes()) : std::string("undefined"));
  MG_CHECK(logsumexp.dtype() == DType::f32, DTypeError, op, ": logsumexp must be f32, got ", logsumexp.dtype());
  check_same_device(op, q, logsumexp, "logsumexp");
  check_out(op, grad_q, "grad_q", out_shape, q);
  check_out(op, grad_k, "grad_k", kv_shape, q);
  check_out(op, grad_v, "grad_v", kv_shape, q);
#if MG_LN_HAS_CUDA
  const DType dt = q.dtype();
  const bool tc = uses_tc(dt, s.E);
  const HeadsOut gq(grad_q, s.bh, s.L, s.E, tc), gk(grad_k, s.bh, s.S, s.E, tc), gv(grad_v, s.bh, s.S, s.E, tc);
  cuda::flash_attention_backward(heads_in(grad_out, dt, s.bh, s.L, s.E, tc), heads_in(q, dt, s.bh, s.L, s.E, tc),
                                 heads_in(k, dt, s.bh, s.S, s.E, tc), heads_in(v, dt, s.bh, s.S, s.E, tc),
                                 heads_in(out, dt, s.bh, s.L, s.E, tc), as_rows(logsumexp, DType::f32, {s.bh, s.L}),
                                 causal, sc, gq.heads, gk.heads, gv.heads);
  gq.finish(), gk.finish(), gv.finish();
#else
  (void)causal, (void)sc;
#endif
}

std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out,
                                                            const Tensor& logsumexp, bool causal,
                                                            std::optional<double> scale) {
  FlashShape s;
  check_flash("flash_attention_backward", q, k, v, &s);
  const TensorOptions o{q.dtype(), q.device()};
  Tensor gq = empty(with_tail(s.lead, {s.L, s.E}), o), gk = empty(with_tail(s.lead, {s.S, s.E}), o),
         gv = empty(with_tail(s.lead, {s.S, s.E}), o);
  flash_attention_backward_out(grad_out, q, k, v, out, logsumexp, causal, scale, gq, gk, gv);
  return {gq, gk, gv};
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
