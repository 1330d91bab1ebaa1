// Layer norm, embedding and scaled dot-product attention. Layer norm's backward is the
// fused kernel (it needs only x, weight and the row statistics); embedding's is an
// index_add into a dense zero gradient; attention's reference path is composed of
// differentiable ops, so its backward is theirs, while its CUDA path is the flash kernel
// pair of kernels/cuda/attention.cu, saving O(L) per row instead of the [L, S] matrices.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "autograd/autocast_policy.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "kernels/ops.h"
#include "kernels/ops.h"

namespace mg {

using autograd::any_requires_grad;
using autograd::needs_grad;
using autograd::record;
using autograd::reduce_grad;
using autograd::SavedTensor;
using Grads = std::vector<Tensor>;

// ---------------- layer norm ----------------

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (autograd::recompute_hook)
    if (Tensor r = autograd::recompute_hook("layer_norm", x,
                                            [normalized_shape, weight, bias, eps](const Tensor& in) {
                                              return layer_norm(in, normalized_shape, weight, bias, eps);
                                            });
        r.defined())
      return r;
  if (autocast::widen_needed({&x, &weight, &bias}))
    return layer_norm(autocast::widen(x), normalized_shape, autocast::widen(weight), autocast::widen(bias), eps);
  auto [out, mean, rstd] = kernels::layer_norm_forward(x, normalized_shape, weight, bias, eps);
  if (!any_requires_grad({x, weight, bias})) return out;
  const std::array<bool, 3> mask{needs_grad(x), needs_grad(weight), needs_grad(bias)};
  // The normalized activations are not saved: backward recomputes them from the statistics.
  record("layer_norm", {x, weight, bias}, out,
         [mask, normalized_shape, sx = SavedTensor(x, "layer_norm"),
          sw = weight.defined() ? SavedTensor(weight, "layer_norm") : SavedTensor(),
          smean = SavedTensor(mean, "layer_norm"), srstd = SavedTensor(rstd, "layer_norm"), x_dt = x.dtype(),
          w_dt = weight.defined() ? weight.dtype() : x.dtype(),
          b_dt = bias.defined() ? bias.dtype() : x.dtype()](const Grads& g) {
           Tensor xv = sx.unpack();
           auto [gx, gw, gb] = kernels::layer_norm_backward(g[0], xv, normalized_shape, smean.unpack(), srstd.unpack(),
                                                            sw.unpack(), mask);
           return Grads{reduce_grad(gx, xv.sizes(), x_dt), reduce_grad(gw, normalized_shape, w_dt),
                        reduce_grad(gb, normalized_shape, b_dt)};
         });
  return out;
}

// ---------------- embedding ----------------

namespace {
// Host-side bounds check with a message naming the index, where it sits and the table size
// (CUDA indices are checked by the index_select kernel itself).
template <class I>
void check_embedding_indices(const Tensor& flat, int64_t num_embeddings) {
  const I* p = flat.data_ptr<I>();
  for (int64_t i = 0; i < flat.numel(); ++i)
    MG_CHECK(p[i] >= 0 && p[i] < num_embeddings, IndexError, "embedding: index ", static_cast<int64_t>(p[i]),
             " at position ", i, " is out of range for num_embeddings ", num_embeddings, " (valid indices are 0..",
             num_embeddings - 1, ")");
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  MG_CHECK(weight.defined() && indices.defined(), ValueError, "embedding: got an undefined tensor");
  MG_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape ",
           shape_str(weight.sizes()));
  MG_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, DTypeError,
           "embedding: indices must be integers (i64 or i32), got ", indices.dtype());
  MG_CHECK(indices.device() == weight.device(), DeviceError, "embedding: indices are on ", indices.device(),
           " but weight is on ", weight.device());
  const int64_t V = weight.size(0), D = weight.size(1);
  Tensor flat = raw::reshape(raw::contiguous(indices), {indices.numel()});
  if (!flat.is_cuda())
    MG_DISPATCH_INDEX(flat.dtype(), "embedding", [&] { check_embedding_indices<scalar_t>(flat, V); });
  Shape out_shape = indices.sizes();
  out_shape.push_back(D);
  Tensor out = raw::view(kernels::index_select(weight, 0, flat), out_shape);
  if (any_requires_grad({weight}))
    record("embedding", {weight}, out,
           [V, D, dt = weight.dtype(), si = SavedTensor(flat, "embedding")](const Grads& g) {
             // Dense gradient: one row per embedding, repeated indices add up (no sparse gradients).
             Tensor z = zeros({V, D}, {g[0].dtype(), g[0].device()});
             kernels::index_add_(z, 0, si.unpack(), raw::reshape(g[0], {-1, D}));
             return Grads{reduce_grad(z, {V, D}, dt)};
           });
  return out;
}

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

Tensor sdpa_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
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
  auto [out, lse] = kernels::flash_attention_forward(q, k, v, causal, scale);
  if (!any_requires_grad({q, k, v})) return out;
  record(op, {q, k, v}, out,
         [causal, scale, sq = SavedTensor(q, op), sk = SavedTensor(k, op), sv = SavedTensor(v, op),
          so = SavedTensor(out, op), sl = SavedTensor(lse, op), q_shape = q.sizes(), k_shape = k.sizes(),
          v_shape = v.sizes(), q_dt = q.dtype(), k_dt = k.dtype(), v_dt = v.dtype()](const Grads& g) {
           auto [gq, gk, gv] = kernels::flash_attention_backward(g[0], sq.unpack(), sk.unpack(), sv.unpack(),
                                                                 so.unpack(), sl.unpack(), causal, scale);
           return Grads{reduce_grad(gq, q_shape, q_dt), reduce_grad(gk, k_shape, k_dt), reduce_grad(gv, v_shape, v_dt)};
         });
  return out;
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    std::optional<double> scale) {
  if (autocast::lower_needed({&q, &k, &v}))
    return scaled_dot_product_attention(autocast::lower(q), autocast::lower(k), autocast::lower(v), causal, dropout_p,
                                        scale);
  // kernels::attention_kernel makes the one choice: flash (SIMT or tensor cores) for the CUDA
  // inputs those kernels take without dropout, the composed path for the rest.
  const double s = check_sdpa(q, k, v, dropout_p, scale);
  if (kernels::attention_kernel(q, k, v, dropout_p > 0.0) != kernels::AttentionKernel::Composed)
    return flash_sdpa(q, k, v, causal, s);
  return sdpa_reference(q, k, v, causal, dropout_p, scale);
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

Tensor attention_packed_qkv(const Tensor& qkv, int64_t num_heads, bool causal, double dropout_p,
                            std::optional<double> scale) {
  constexpr const char* op = "attention_packed_qkv";
  MG_CHECK(qkv.defined(), ValueError, op, ": got an undefined tensor");
  MG_CHECK(num_heads > 0, ValueError, op, ": num_heads must be positive, got ", num_heads);
  MG_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * num_heads) == 0, ShapeError, op,
           ": expected qkv [B, T, 3C] with C a multiple of num_heads (", num_heads, "), got ", shape_str(qkv.sizes()));
  MG_CHECK(is_floating(qkv.dtype()), DTypeError, op, ": qkv must be floating, got ", qkv.dtype());
  if (autocast::lower_needed({&qkv}))
    return attention_packed_qkv(autocast::lower(qkv), num_heads, causal, dropout_p, scale);
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
  Tensor y = empty({B, T, C}, {qkv.dtype(), qkv.device()});
  // y's [B, H, T, D] view: the kernels write each head's rows into its columns of y.
  Tensor lse =
      kernels::flash_attention_forward_out(q, k, v, raw::transpose(raw::view(y, {B, T, H, D}), 1, 2), causal, s);
  if (!any_requires_grad({qkv})) return y;
  record(op, {qkv}, y,
         [causal, s, H, sqkv = SavedTensor(qkv, op), sy = SavedTensor(y, op), sl = SavedTensor(lse, op),
          shape = qkv.sizes(), dt = qkv.dtype()](const Grads& g) {
           Tensor x = sqkv.unpack(), yv = sy.unpack();
           const int64_t B = x.size(0), T = x.size(1), C = x.size(2) / 3, D = C / H;
           Tensor gqkv = empty(x.sizes(), {x.dtype(), x.device()});
           auto heads = [&](const Tensor& t) { return raw::transpose(raw::reshape(t, {B, T, H, D}), 1, 2); };
           kernels::flash_attention_backward_out(
               heads(g[0]), packed_heads(x, 0, H), packed_heads(x, 1, H), packed_heads(x, 2, H), heads(yv), sl.unpack(),
               causal, s, packed_heads(gqkv, 0, H), packed_heads(gqkv, 1, H), packed_heads(gqkv, 2, H));
           return Grads{reduce_grad(gqkv, shape, dt)};
         });
  return y;
}

}  // namespace mg
