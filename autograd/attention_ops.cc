// Scaled dot-product attention. kernels::attention_kernel picks the path: the composed one
// (differentiable ops, so its backward is theirs) or the flash kernels of kernels/attention.h,
// which save O(L) per row instead of the [L, S] matrices.
#include <cmath>
#include <limits>

#include "autograd/op_support.h"

namespace mg {

// ---------------- scaled dot-product attention ----------------

namespace {
double check_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  MG_CHECK(q.defined() && k.defined() && v.defined(), ValueError, op, ": got an undefined tensor");
  MG_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError, op,
           ": query, key and value must have the same rank >= 2 ([..., L, E], [..., S, E], [..., S, Ev]), got ",
           shape_str(q.sizes()), ", ", shape_str(k.sizes()), " and ", shape_str(v.sizes()));
  MG_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(), DTypeError, op,
           ": query, key and value must share one floating dtype, got ", q.dtype(), ", ", k.dtype(), " and ",
           v.dtype());
  MG_CHECK(q.device() == k.device() && q.device() == v.device(), DeviceError, op, ": query, key and value are on ",
           q.device(), ", ", k.device(), " and ", v.device());
  MG_CHECK(q.size(-1) == k.size(-1), ShapeError, op, ": query head dim ", q.size(-1), " does not match key head dim ",
           k.size(-1), " (query ", shape_str(q.sizes()), ", key ", shape_str(k.sizes()), ")");
  MG_CHECK(k.size(-2) == v.size(-2), ShapeError, op, ": key has ", k.size(-2), " positions but value has ", v.size(-2),
           " (key ", shape_str(k.sizes()), ", value ", shape_str(v.sizes()), ")");
  for (int64_t d = 0; d < q.dim() - 2; ++d)
    MG_CHECK(q.size(d) == k.size(d) && q.size(d) == v.size(d), ShapeError, op,
             ": query, key and value must have the same batch/head dims, got ", shape_str(q.sizes()), ", ",
             shape_str(k.sizes()), " and ", shape_str(v.sizes()), " (dim ", d, ")");
  MG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, ValueError, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  MG_CHECK(!scale || std::isfinite(*scale), ValueError, op, ": scale must be finite, got ", scale.value_or(0.0));
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}
}  // namespace

Tensor sdpa_composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                     std::optional<double> scale) {
  const double s = check_sdpa(q, k, v, dropout_p, scale);
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), s);  // [..., L, S]
  if (causal) {
    const int64_t L = q.size(-2), S = k.size(-2);
    const TensorOptions idx{DType::i64, q.device()};
    // allowed[i, j] = (j <= i): query i sees keys 0..i.
    Tensor allowed =
        kernels::binary(kernels::Binary::Ge, raw::view(arange(L, idx), {L, 1}), raw::view(arange(S, idx), {1, S}));
    Tensor neg_inf = scalar_tensor(-std::numeric_limits<double>::infinity(), {scores.dtype(), scores.device()});
    scores = where(allowed, scores, neg_inf);
  }
  Tensor attn = softmax(scores, -1);
  if (dropout_p > 0.0) attn = dropout(attn, dropout_p, /*training=*/true);
  return matmul(attn, v);
}

namespace {
// The memory-efficient path: the node saves q, k, v, out and the per-row logsumexp
// ([..., L] f32), never the [L, S] probabilities; backward recomputes them tile by tile.
// Its backward is a kernel, not differentiable ops, so no double backward through it.
Tensor flash_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  constexpr const char* op = "scaled_dot_product_attention";
  Tensor out, lse;
  Shape out_shape = q.sizes();
  out_shape.back() = v.size(-1);
  const auto outs = autograd::kept_or_run("attention", out_shape, [&] {
    auto [o, l] = kernels::flash_attention_forward(q, k, v, causal, scale);
    return std::vector<Tensor>{o, l};
  });
  out = outs[0], lse = outs[1];
  if (!any_requires_grad({q, k, v})) return out;
  record(op, {q, k, v}, out,
         [causal, scale, sq = SavedTensor(q, op), sk = SavedTensor(k, op), sv = SavedTensor(v, op),
          so = SavedTensor(out, op), sl = SavedTensor(lse, op)](const Grads& g) {
           auto [gq, gk, gv] = kernels::flash_attention_backward(g[0], sq.unpack(), sk.unpack(), sv.unpack(),
                                                                 so.unpack(), sl.unpack(), causal, scale);
           return Grads{gq, gk, gv};
         });
  return out;
}
}  // namespace

namespace {
Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                         double dropout_p, std::optional<double> scale) {
  // kernels::attention_kernel makes the one choice: flash (SIMT or tensor cores) for the CUDA
  // inputs those kernels take without dropout, the composed path for the rest.
  const double s = check_sdpa(q, k, v, dropout_p, scale);
  if (kernels::attention_kernel(q, k, v, dropout_p > 0.0) != kernels::AttentionKernel::Composed)
    return flash_sdpa(q, k, v, causal, s);
  return sdpa_composed(q, k, v, causal, dropout_p, scale);
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    std::optional<double> scale) {
  return around(policy::attention, scaled_dot_product_attention_math, q, k, v, causal, dropout_p, scale);
}

// ---------------- attention from a packed [B, T, 3C] projection ----------------

namespace {
// Part i (0 = q, 1 = k, 2 = v) of a [B, T, 3C] tensor as [B, H, T, D]: a strided view (a copy
// only when t's strides can't express it, which a [B, T, 3C] of any dense layout never needs).
Tensor packed_heads(const Tensor& t, int64_t i, int64_t H) {
  const int64_t B = t.size(0), T = t.size(1), C = t.size(2) / 3;
  return raw::transpose(raw::reshape(raw::slice(t, 2, i * C, (i + 1) * C, 1), {B, T, H, C / H}), 1, 2);
}
}  // namespace

namespace {
Tensor attention_packed_qkv_math(const Tensor& qkv, int64_t num_heads, bool causal, double dropout_p,
                                 std::optional<double> scale) {
  constexpr const char* op = "attention_packed_qkv";
  MG_CHECK(qkv.defined(), ValueError, op, ": got an undefined tensor");
  MG_CHECK(num_heads > 0, ValueError, op, ": num_heads must be positive, got ", num_heads);
  MG_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * num_heads) == 0, ShapeError, op,
           ": expected qkv [B, T, 3C] with C a multiple of num_heads (", num_heads, "), got ", shape_str(qkv.sizes()));
  MG_CHECK(is_floating(qkv.dtype()), DTypeError, op, ": qkv must be floating, got ", qkv.dtype());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = num_heads, D = C / H;
  MG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, ValueError, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  MG_CHECK(!scale || std::isfinite(*scale), ValueError, op, ": scale must be finite, got ", scale.value_or(0.0));
  Tensor q, k, v;
  bool flash = qkv.is_cuda() && T > 0;
  if (flash) {
    q = packed_heads(qkv, 0, H), k = packed_heads(qkv, 1, H), v = packed_heads(qkv, 2, H);
    flash = kernels::attention_kernel(q, k, v, dropout_p > 0.0) != kernels::AttentionKernel::Composed;
  }
  if (!flash) {
    // The composed path: differentiable views around scaled_dot_product_attention.
    auto split = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, H, D}).transpose(1, 2); };
    Tensor y = scaled_dot_product_attention(split(0), split(1), split(2), causal, dropout_p, scale);
    return y.transpose(1, 2).reshape({B, T, C});
  }
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
  Tensor y, lse;
  const auto outs = autograd::kept_or_run("attention", {B, T, C}, [&] {
    Tensor o = empty({B, T, C}, {qkv.dtype(), qkv.device()});
    // o's [B, H, T, D] view: the kernels write each head's rows into its columns of o.
    Tensor l =
        kernels::flash_attention_forward_out(q, k, v, raw::transpose(raw::view(o, {B, T, H, D}), 1, 2), causal, s);
    return std::vector<Tensor>{o, l};
  });
  y = outs[0], lse = outs[1];
  if (!any_requires_grad({qkv})) return y;
  record(
      op, {qkv}, y,
      [causal, s, H, sqkv = SavedTensor(qkv, op), sy = SavedTensor(y, op), sl = SavedTensor(lse, op)](const Grads& g) {
        Tensor x = sqkv.unpack(), yv = sy.unpack();
        const int64_t B = x.size(0), T = x.size(1), C = x.size(2) / 3, D = C / H;
        Tensor gqkv = empty(x.sizes(), {x.dtype(), x.device()});
        auto heads = [&](const Tensor& t) { return raw::transpose(raw::reshape(t, {B, T, H, D}), 1, 2); };
        kernels::flash_attention_backward_out(
            heads(g[0]), packed_heads(x, 0, H), packed_heads(x, 1, H), packed_heads(x, 2, H), heads(yv), sl.unpack(),
            causal, s, packed_heads(gqkv, 0, H), packed_heads(gqkv, 1, H), packed_heads(gqkv, 2, H));
        return Grads{gqkv};
      });
  return y;
}
}  // namespace

Tensor attention_packed_qkv(const Tensor& qkv, int64_t num_heads, bool causal, double dropout_p,
                            std::optional<double> scale) {
  return around(policy::attention_packed_qkv, attention_packed_qkv_math, qkv, num_heads, causal, dropout_p, scale);
}

}  // namespace mg
