// Losses. cross_entropy is one fused kernel pair (kernels/loss.h: logsumexp per
// row forward, softmax - target distribution backward); nll_loss scatters -g into the target column.

#include "autograd/op_support.h"

namespace mg {

// ---------------- losses ----------------

namespace {
enum class Reduction { None, Sum, Mean };

Reduction parse_reduction(const std::string& r, const char* op) {
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  if (r == "none") return Reduction::None;
  MG_THROW(ValueError, op, ": reduction must be \"mean\", \"sum\" or \"none\", got \"", r, "\"");
}

// Class scores [N, C, d1, ...] (or [C]) and targets [N, d1, ...] (or []) as [M, C] and [M]:
// the class dim moves last (differentiably) and everything else is flattened into rows.
struct Rows {
  Tensor scores;  // [M, C]
  Tensor target;  // i64 [M]
  Shape target_shape;
};

Rows to_rows(const Tensor& scores, const Tensor& target, const char* op) {
  MG_CHECK(scores.defined() && target.defined(), ValueError, op, ": undefined input");
  MG_CHECK(is_floating(scores.dtype()), DTypeError, op, ": input must be floating, got ", scores.dtype());
  MG_CHECK(!is_floating(target.dtype()), DTypeError, op, ": target must hold class indices (i64), got ", target.dtype(),
           " of shape ", shape_str(target.sizes()),
           "; one-hot targets: use target.argmax(1) to get class indices (probabilities as targets are not supported)");
  MG_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, DTypeError, op,
           ": target must hold class indices (i64), got ", target.dtype());
  MG_CHECK(scores.dim() >= 1, ShapeError, op, ": input must have a class dim, got a 0-dim tensor");
  Shape expected;
  if (scores.dim() == 1) {
    expected = {};
  } else {
    expected = scores.sizes();
    expected.erase(expected.begin() + 1);
  }
  MG_CHECK(target.sizes() == expected, ShapeError, op, ": target shape ", shape_str(target.sizes()),
           " does not match input shape ", shape_str(scores.sizes()), " (expected target of shape ",
           shape_str(expected), ": one class index per row)");
  const int64_t C = scores.dim() == 1 ? scores.size(0) : scores.size(1);
  Rows r;
  r.target_shape = target.sizes();
  if (scores.dim() == 1) {
    r.scores = scores.unsqueeze(0);
  } else if (scores.dim() == 2) {
    r.scores = scores;
  } else {
    Shape perm{0};
    for (int64_t d = 2; d < scores.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    r.scores = scores.permute(perm).reshape({-1, C});
  }
  Tensor t = target.dtype() == DType::i64 ? target : kernels::cast(target, DType::i64);
  r.target = raw::reshape(t, {-1});
  return r;
}

// Out-of-range labels are an IndexError naming the first offender (checked on the host
// for CPU targets; the CUDA kernel checks its own).
void check_labels(const Tensor& target, int64_t C, int64_t ignore_index, const char* op) {
  if (target.is_cuda()) return;
  Tensor t = raw::contiguous(target);
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    MG_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < C), IndexError, op, ": target ", p[i], " at position ", i,
             " is out of range for ", C, " classes (expected [0, ", C - 1, "] or ignore_index ", ignore_index, ")");
}

// True (b8) for rows that count, false for ignore_index rows.
Tensor is_valid(const Tensor& target, int64_t ignore_index) {
  Tensor ign = scalar_tensor(static_cast<double>(ignore_index), {DType::i64, target.device()});
  return kernels::binary(kernels::Binary::Ne, target, ign);
}
Tensor valid_mask(const Tensor& target, int64_t ignore_index, DType dtype) {
  return kernels::cast(is_valid(target, ignore_index), dtype);
}

// nll over rows: log_probs [M, C], target i64 [M]; returns [M] / scalar per reduction.
Tensor nll_rows(const Tensor& lp, const Tensor& target, Reduction red, int64_t ignore_index) {
  Tensor per = kernels::nll_loss_forward(lp, target, ignore_index);  // [M], 0 where ignored
  Tensor keep = is_valid(target, ignore_index);
  Tensor valid = kernels::cast(keep, lp.dtype());
  Tensor count = kernels::sum(valid);  // stays on the device: no host sync
  Tensor out = red == Reduction::None  ? per
               : red == Reduction::Sum ? kernels::sum(per)
                                       : kernels::div(kernels::sum(per), count);
  if (any_requires_grad({lp})) {
    // Ignored rows scatter a 0 into column 0 (their label may be any value, e.g. -100).
    Tensor safe = kernels::where(keep, target, scalar_tensor(0.0, {DType::i64, target.device()}));
    record("nll_loss", {lp}, out,
           [red, shape = lp.sizes(), valid, count, safe = raw::unsqueeze(safe, 1)](const Grads& g) {
             Tensor coef = red == Reduction::Mean ? kernels::div(g[0], count) : g[0];  // [M] or 0-dim
             Tensor src = kernels::unary(kernels::Unary::Neg, kernels::mul(coef, valid));
             Tensor z = zeros(shape, {src.dtype(), src.device()});
             kernels::scatter_(z, 1, safe, raw::unsqueeze(src, 1));
             return Grads{z};
           });
  }
  return out;
}
}  // namespace

namespace {
Tensor nll_loss_math(const Tensor& log_probs, const Tensor& target, const std::string& reduction,
                     int64_t ignore_index) {
  const Reduction red = parse_reduction(reduction, "nll_loss");
  Rows r = to_rows(log_probs, target, "nll_loss");
  check_labels(r.target, r.scores.size(1), ignore_index, "nll_loss");
  Tensor out = nll_rows(r.scores, r.target, red, ignore_index);
  return red == Reduction::None ? out.reshape(r.target_shape) : out;
}
}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const std::string& reduction, int64_t ignore_index) {
  return around(policy::nll_loss, nll_loss_math, log_probs, target, reduction, ignore_index);
}

// Fused: kernels::cross_entropy_forward keeps one logsumexp per row (f32) instead of the
// [M, C] log-probabilities, reads half-precision logits as they are (computing in f32, which
// is what autocast's f32 policy asks for, without an f32 copy of the logits), and the
// backward writes coef * (softmax - target distribution) in one pass.
namespace {
// Class probabilities as targets (one-hot or soft labels, same shape as the logits):
// -sum_c p_c log_softmax(x)_c per row, PyTorch's semantics (mean divides by the row count;
// label smoothing mixes in the uniform distribution). Composed, so it costs what the seeds'
// one-hot example costs: an [M, C] target and an [M, C] log-probability tensor.
Tensor cross_entropy_probs(const Tensor& logits, const Tensor& target, Reduction red, double e) {
  MG_CHECK(target.sizes() == logits.sizes(), ShapeError,
           "cross_entropy: probability targets must have the input's shape ", shape_str(logits.sizes()), ", got ",
           shape_str(target.sizes()), " (class-index targets: an integer tensor without the class dim)");
  MG_CHECK(logits.dim() >= 1, ShapeError, "cross_entropy: input must have a class dim, got a 0-dim tensor");
  const int64_t cdim = logits.dim() == 1 ? 0 : 1;
  Tensor p = target.dtype() == logits.dtype() ? target : target.to(logits.dtype());
  if (e > 0.0) p = add(mul(p, 1.0 - e), e / static_cast<double>(logits.size(cdim)));
  Tensor per = neg(sum(mul(log_softmax(logits, cdim), p), {cdim}));
  if (red == Reduction::None) return per;
  return red == Reduction::Sum ? sum(per) : mean(per);
}

Tensor cross_entropy_probs_math(const Tensor& logits, const Tensor& target, const std::string& reduction, int64_t,
                                double label_smoothing) {
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
           "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  return cross_entropy_probs(logits, target, parse_reduction(reduction, "cross_entropy"), label_smoothing);
}

// Class-index targets: the fused kernel (the CPU kernel is f32/f64, the CUDA one reads f16/bf16).
Tensor cross_entropy_math(const Tensor& logits, const Tensor& target, const std::string& reduction,
                          int64_t ignore_index, double label_smoothing) {
  const Reduction red = parse_reduction(reduction, "cross_entropy");
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
           "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  Rows r = to_rows(logits, target, "cross_entropy");
  // Labels are range-checked by the kernel itself (CPU loop or CUDA flag), in its one pass.
  auto [per, lse] = kernels::cross_entropy_forward(r.scores, r.target, ignore_index, label_smoothing);
  Tensor count;
  if (red == Reduction::Mean) count = kernels::sum(valid_mask(r.target, ignore_index, per.dtype()));  // on the device
  Tensor out = red == Reduction::None  ? per
               : red == Reduction::Sum ? kernels::sum(per)
                                       : kernels::div(kernels::sum(per), count);
  if (any_requires_grad({r.scores})) {
    constexpr const char* op = "cross_entropy";
    record(
        op, {r.scores}, out,
        [red, ignore_index, label_smoothing, count, lse = lse, target = r.target,
         sx = SavedTensor(r.scores, op)](const Grads& g) {
          Tensor coef = red == Reduction::Mean ? kernels::div(g[0], count) : g[0];  // [M] or one element
          return Grads{kernels::cross_entropy_backward(coef, sx.unpack(), target, lse, ignore_index, label_smoothing)};
        });
  }
  return red == Reduction::None ? out.reshape(r.target_shape) : out;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction, int64_t ignore_index,
                     double label_smoothing) {
  if (logits.defined() && target.defined() && is_floating(target.dtype()) && is_floating(logits.dtype()))
    return around(policy::cross_entropy_probs, cross_entropy_probs_math, logits, target, reduction, ignore_index,
                  label_smoothing);
  return around(policy::cross_entropy, cross_entropy_math, logits, target, reduction, ignore_index, label_smoothing);
}

// linear + cross_entropy without the logits: the loss is the graph's end, so its gradient with
// respect to the logits is known in the forward pass up to the scalar coefficient the backward
// brings (g / count). Each chunk of rows makes its logits, its loss and, over the logits, their
// gradient (softmax - onehot) * prescale (kernels::cross_entropy_forward_backward: one read of
// the logits on CUDA), and folds them into the two products the gradients need:
// gx_raw = d @ w and gw_raw += d^T @ x, both f32 for half inputs (widening GEMMs), so chunking
// adds no rounding. The backward is two scalings. Peak extra memory: one chunk of logits and
// the two accumulators, instead of the [M, V] logits and their [M, V] gradient.
namespace {
// f16 keeps (softmax - onehot) * 1024 so probabilities down to 6e-11 stay normal numbers (the
// ones a GradScaler would otherwise lift); a power of two divides back out exactly.
double logit_grad_prescale(DType t) { return t == DType::f16 ? 1024.0 : 1.0; }
}  // namespace

namespace {
Tensor linear_cross_entropy_math(const Tensor& x, const Tensor& weight, const Tensor& target,
                                 const std::string& reduction, int64_t ignore_index, double label_smoothing,
                                 int64_t chunk_rows) {
  constexpr const char* op = "linear_cross_entropy";
  MG_CHECK(x.defined() && weight.defined() && target.defined(), ValueError, op, ": undefined input");
  MG_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), ShapeError, op, ": x ",
           shape_str(x.sizes()), " and weight ", shape_str(weight.sizes()),
           " do not chain (expected weight [classes, in] with in == x.size(-1))");
  MG_CHECK(chunk_rows >= 0, ValueError, op, ": chunk_rows must be >= 0 (0: automatic), got ", chunk_rows);
  const Reduction red = parse_reduction(reduction, op);
  MG_CHECK(x.dtype() == weight.dtype(), DTypeError, op, ": x is ", x.dtype(), " but weight is ", weight.dtype());
  MG_CHECK(x.device() == weight.device() && x.device() == target.device(), DeviceError, op, ": x on ", x.device(),
           ", weight on ", weight.device(), ", target on ", target.device());
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, op,
           ": label_smoothing must be in [0, 1], got ", label_smoothing);
  Shape rows_shape = x.sizes();
  rows_shape.pop_back();
  MG_CHECK(!is_floating(target.dtype()), DTypeError, op, ": target must hold class indices (i64), got ",
           target.dtype());
  MG_CHECK(target.sizes() == rows_shape, ShapeError, op, ": target shape ", shape_str(target.sizes()),
           " does not match x ", shape_str(x.sizes()), " (expected ", shape_str(rows_shape), ": one class per row)");
  // Per-row losses need the logits' rows, and the CPU's kernels are f32/f64: both compose, on the
  // rows ([N, classes] logits, [N] targets: cross_entropy's class-index layout), the per-row
  // losses shaped back as x's rows.
  const bool cpu_half = !x.is_cuda() && (x.dtype() == DType::f16 || x.dtype() == DType::bf16);
  if (red == Reduction::None || cpu_half) {
    const Tensor loss = cross_entropy(linear(reshape(x, {-1, x.size(-1)}), weight), reshape(target, {-1}), reduction,
                                      ignore_index, label_smoothing);
    return red == Reduction::None ? reshape(loss, rows_shape) : loss;
  }
  const int64_t K = weight.size(1), C = weight.size(0);
  const Tensor x2 = raw::reshape(x, {-1, K});
  const Tensor t = raw::reshape(target.dtype() == DType::i64 ? target : kernels::cast(target, DType::i64), {-1});
  const int64_t M = x2.size(0);
  const bool need_x = needs_grad(x), need_w = needs_grad(weight);
  const DType ad = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const TensorOptions acc{ad, x.device()};
  // Rows per chunk: enough to keep the GEMMs large, few enough that one chunk's logits stay near
  // 512 MiB (GPT-2's 50304 classes in bf16: 5336 rows); chunks are balanced.
  const int64_t auto_rows = std::max<int64_t>(
      1, (int64_t{512} << 20) / std::max<int64_t>(1, C * static_cast<int64_t>(dtype_size(x.dtype()))));
  const int64_t want = chunk_rows > 0 ? chunk_rows : auto_rows;
  const int64_t chunks = M == 0 ? 0 : (M + want - 1) / want, step = chunks == 0 ? 0 : (M + chunks - 1) / chunks;
  const double prescale = logit_grad_prescale(x.dtype());
  Tensor per = empty({M}, acc), gx_raw, gw_raw;
  if (need_x) gx_raw = empty({M, K}, acc);
  if (need_w) gw_raw = empty({C, K}, acc);
  const Tensor coef = scalar_tensor(prescale, acc);
  for (int64_t r0 = 0; r0 < M; r0 += step) {
    const int64_t r1 = std::min(M, r0 + step);
    const Tensor xc = raw::slice(x2, 0, r0, r1, 1), tc = raw::slice(t, 0, r0, r1, 1);
    Tensor logits = kernels::linear(xc, weight);  // [rows, C]
    // The loss and, when a gradient is wanted, in place the logits' (one read of them on CUDA).
    const bool grad = need_x || need_w;
    const auto [loss, lse] =
        grad ? kernels::cross_entropy_forward_backward(logits, tc, ignore_index, label_smoothing, coef, logits)
             : kernels::cross_entropy_forward(logits, tc, ignore_index, label_smoothing);
    raw::copy_(raw::slice(per, 0, r0, r1, 1), loss);
    if (!grad) continue;
    if (need_x) kernels::gemm(logits, false, weight, false, raw::slice(gx_raw, 0, r0, r1, 1));
    if (need_w) kernels::gemm(logits, true, xc, false, gw_raw, 1.0, r0 == 0 ? 0.0 : 1.0);
  }
  Tensor count;
  if (red == Reduction::Mean) count = kernels::sum(valid_mask(t, ignore_index, ad));  // on the device
  Tensor out = red == Reduction::Sum ? kernels::sum(per) : kernels::div(kernels::sum(per), count);
  if (need_x || need_w) {
    record(op, {x, weight}, out, [red, prescale, count, gx_raw, gw_raw, xs = x.sizes()](const Grads& g) {
      Tensor c = red == Reduction::Mean ? kernels::div(g[0], count) : g[0];
      if (prescale != 1.0) c = kernels::div(c, scalar_tensor(prescale, {c.dtype(), c.device()}));
      Tensor gx, gw;  // the engine casts them to the inputs' dtypes
      if (gx_raw.defined()) gx = raw::reshape(kernels::mul(gx_raw, c), xs);
      if (gw_raw.defined()) gw = kernels::mul(gw_raw, c);
      return Grads{gx, gw};
    });
  }
  return out;
}
}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target, const std::string& reduction,
                            int64_t ignore_index, double label_smoothing, int64_t chunk_rows) {
  return around(policy::linear_cross_entropy, linear_cross_entropy_math, x, weight, target, reduction, ignore_index,
                label_smoothing, chunk_rows);
}

namespace {
Tensor mse_loss_math(const Tensor& input, const Tensor& target, const std::string& reduction) {
  const Reduction red = parse_reduction(reduction, "mse_loss");
  MG_CHECK(input.sizes() == target.sizes(), ShapeError, "mse_loss: input shape ", shape_str(input.sizes()),
           " and target shape ", shape_str(target.sizes()),
           " differ (broadcasting them is almost always a bug, e.g. [N, 1] vs [N]; reshape one of them)");
  MG_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), DTypeError,
           "mse_loss: input and target must be floating, got ", input.dtype(), " and ", target.dtype());
  Tensor sq = square(sub(input, target));
  return red == Reduction::None ? sq : red == Reduction::Sum ? sum(sq) : mean(sq);
}
}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  return around(policy::mse_loss, mse_loss_math, input, target, reduction);
}

}  // namespace mg
