// The one backend contract: every raw op a device must provide, declared once. cpu/ and cuda/
// implement it (a backend that misses an op does not compile: the classes are `final`).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/env.h"
#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// Contract for every method: the dispatch layer (kernels/<family>.cc) has already checked
// shapes, dtypes and devices, made the inputs the layout the comment names and allocated the
// outputs; a backend only computes into them. Float math accumulates in f32 (f64 for f64).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- elementwise (elementwise.*) ----
  // `a` and `out` have one shape; out has a's dtype (b8 also allowed for LogicalNot).
  virtual void unary(Unary op, const Tensor& a, const Tensor& out) = 0;
  // `a`, `b` already broadcast (expanded views) to out's shape and cast to one dtype; out has
  // that dtype, or b8 for comparisons. `out` may alias `a` (in-place ops).
  virtual void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void clamp(const Tensor& a, double lo, double hi, const Tensor& out) = 0;
  // x has grad's dtype and shape.
  virtual void clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi, const Tensor& out) = 0;
  // out = a*alpha + b*beta; a, b broadcast to out's shape with out's dtype (out may alias a).
  virtual void axpby(const Tensor& a, double alpha, const Tensor& b, double beta, const Tensor& out) = 0;
  // cond is b8; cond, a, b broadcast to out's shape; a, b have out's dtype.
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // Bias, dropout and residual add in one pass (kernels::bias_dropout_add): branch [M, N]
  // contiguous floating; out [M, N] contiguous in branch's dtype, or f32 with an f16/bf16
  // branch; x (the residual) out's shape and dtype, contiguous, or undefined; bias [N] in
  // branch's dtype or undefined; keep b8 [M, N]. keep[i] is drawn as DropoutDraw says and
  // out[i] = x[i] + keep[i] * (branch[i] + bias[i % N]) * scale in the op math type (f32, f64
  // for f64), one rounding.
  virtual void bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, const DropoutDraw& draw,
                                const Tensor& out, const Tensor& keep) = 0;
  // out = grad * keep * scale, one rounding; grad and out of one floating dtype, or an f32
  // grad with an f16/bf16 out; keep b8; all contiguous of one shape.
  virtual void dropout_backward(const Tensor& grad, const Tensor& keep, double scale, const Tensor& out) = 0;

  // ---- reductions (reduce.*); `out` has a's rank with size 1 on the reduced dims ----
  // out: a's dtype (floating), f32 for f16/bf16 a, or i64 for integer a
  virtual void sum(const Tensor& a, const Tensor& out) = 0;
  virtual void mean(const Tensor& a, const Tensor& out) = 0;                     // floating only
  virtual void var(const Tensor& a, int64_t correction, const Tensor& out) = 0;  // floating only
  // values/indices have a's rank with size 1 at `dim`; a.size(dim) > 0; indices i64.
  virtual void max_min(const Tensor& a, int64_t dim, bool is_max, const Tensor& values, const Tensor& indices) = 0;
  virtual void sum_squares(const Tensor& a, const Tensor& out) = 0;  // out: 0-dim f32 or f64
  virtual bool has_nonfinite(const Tensor& a) = 0;                   // reads one flag back to the host

  // ---- linear algebra (linalg.*); f64, f32, f16, bf16 ----
  // out = alpha * op(a) @ op(b) + beta * out for 2-D tensors of one dtype (any strides).
  virtual void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha,
                    double beta) = 0;
  // [B, n, k] @ [B, k, m] -> out [B, n, m] (out contiguous); batch strides may be 0 (broadcast).
  virtual void bmm(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out [M, N] (contiguous) = x [M, K] @ w[N, K]^T + bias [N] (bias may be undefined).
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) = 0;
  // gw [N, K] = g [M, N]^T @ x [M, K] and gb [N] = g summed over rows, by the backend's own
  // route (all contiguous; CUDA: a cuBLASLt GEMM, then its column reduction); false when the
  // backend has none for these operands, and the caller runs a GEMM and a sum instead. gb may be undefined (gw alone);
  // gw and gb may be f32 from f16/bf16 g and x.
  virtual bool fused_linear_weight_grads(const Tensor& g, const Tensor& x, const Tensor& gw, const Tensor& gb) = 0;
  // The MLP's GEMMs with the tanh GELU inside (false when the backend has none for these
  // operands; the caller composes). Forward: pre [M, N] = x [M, K] @ w [N, K]^T + bias [N] and
  // out = gelu(pre), one GEMM writing both. Backward: g_pre [M, N] = (g [M, K] @ w [K, N]) *
  // gelu'(pre), one GEMM. All contiguous, one dtype.
  virtual bool fused_linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                 const Tensor& pre) = 0;
  virtual bool fused_matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre, const Tensor& g_pre) = 0;

  // ---- softmax family (softmax.*); floating only, same dtype in and out ----
  virtual void softmax(const Tensor& a, int64_t dim, bool log, const Tensor& out) = 0;
  virtual void softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const Tensor& out) = 0;

  // ---- losses (loss.*) ----
  // out has target's shape; class dim of log_probs is 1 (0 for 1-D input); targets i64, bounds-checked here.
  virtual void nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                                const Tensor& out) = 0;
  // logits [M, C] contiguous, target i64 [M] contiguous; loss and lse [M] in f32 (f64 for f64).
  // Returns the first target outside [0, C) other than ignore_index, or ignore_index when none
  // (a backend that can also name the row raises mg::IndexError itself).
  virtual int64_t cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                        double smoothing, const Tensor& loss, const Tensor& lse) = 0;
  // coef [M] or [1] in lse's dtype; grad has logits' shape and dtype and is fully overwritten.
  virtual void cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                      int64_t ignore_index, double smoothing, const Tensor& grad) = 0;
  // cross_entropy_forward, then cross_entropy_backward(coef, ...) into grad, which may be logits
  // itself: a backend may read the logits once. Returns what cross_entropy_forward returns.
  virtual int64_t cross_entropy_forward_backward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                 double smoothing, const Tensor& coef, const Tensor& loss,
                                                 const Tensor& lse, const Tensor& grad) = 0;

  // ---- indexing (index.*); index tensors are i64 or i32 and are bounds-checked here ----
  virtual void one_hot(const Tensor& indices, int64_t num_classes, const Tensor& out) = 0;
  virtual void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) = 0;
  virtual void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add) = 0;
  virtual void index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) = 0;
  // index_add with `checked`: the caller has already checked index against self's size along dim
  // (kernels::IndexBounds::Checked); a backend whose check costs a host synchronization skips it.
  virtual void index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool checked) = 0;

  // ---- layer norm (layer_norm.*) ----
  // x [M, N] contiguous; weight/bias [N] of x's dtype or undefined; out [M, N] of x's dtype,
  // mean/rstd [M] in f32 (f64 for f64), all fully overwritten.
  virtual void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& out, const Tensor& mean, const Tensor& rstd) = 0;
  // Each defined output (grad_x [M, N], grad_weight/grad_bias [N]) is fully overwritten.
  virtual void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                                   const Tensor& grad_bias) = 0;
  // Residual add fused into layer norm (pre-LN transformer blocks); false when the backend
  // has no fused kernel for these dtypes and the caller composes. Forward: sum = (x + residual)
  // + residual_bias (residual defined, any float dtype; residual_bias [n] of x's dtype or
  // undefined; sum has x's dtype), out = layer_norm(sum) in out's dtype (the cast for a
  // low-precision consumer in the same pass); without a residual the input x is normalized and
  // sum is not written. Backward: with g = grad_out (out's dtype), grad_x = grad_sum (x's
  // dtype, may be undefined) + layer norm backward of g, also written to grad_x_low in its
  // dtype when defined (the residual branch's gradient), and grad_residual_bias (x's dtype,
  // when defined) = grad_x summed over the rows.
  virtual bool fused_add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& residual_bias,
                                            const Tensor& weight, const Tensor& bias, double eps, const Tensor& sum,
                                            const Tensor& out, const Tensor& mean, const Tensor& rstd) = 0;
  virtual bool fused_add_layer_norm_backward(const Tensor& grad_out, const Tensor& grad_sum, const Tensor& sum,
                                             const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                             const Tensor& grad_x, const Tensor& grad_x_low, const Tensor& grad_weight,
                                             const Tensor& grad_bias, const Tensor& grad_residual_bias) = 0;
  // The forward's rows (fused_add_layer_norm_forward's x, residual, residual_bias, weight, bias,
  // eps, sum, mean and rstd) with the normalized rows rounded to out_dtype and cast as
  // fp8_quantize_transpose_delayed casts them (history, slot, format, margin, scale, scale_inv,
  // out, out_t; either output may be undefined), never written in out_dtype: the FP8 recipe's
  // cast of the input of the linear that reads the norm, made where the norm has the rows. False
  // where the backend has no such kernel; kernels::add_layer_norm_fp8_delayed then composes them.
  virtual bool fused_add_layer_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& residual_bias,
                                        const Tensor& weight, const Tensor& bias, double eps, DType out_dtype,
                                        const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& history, int slot, Fp8Format format, int margin,
                                        const Tensor& scale, const Tensor& scale_inv, const Tensor& out,
                                        const Tensor& out_t) = 0;

  // ---- batch norm (batch_norm.*); x [N, C, *] contiguous (on CUDA also channels-last),
  // per-channel tensors [C] of x's dtype (on CUDA f32 for an f16/bf16 x as well) ----
  virtual void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, double momentum,
                                           double eps, const Tensor& out, const Tensor& save_mean,
                                           const Tensor& save_invstd) = 0;
  virtual void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var, double eps,
                                       const Tensor& out) = 0;
  virtual void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& invstd, bool training, const Tensor& grad_x, const Tensor& grad_weight,
                                   const Tensor& grad_bias) = 0;
  // Batch norm with the ReLU after it in the same passes, where the backend fuses them for
  // this input: the training forward writes max(0, normalized) (max(0, normalized + residual)
  // with a residual of x's shape, dtype and layout: a ResNet block's output); the backward first
  // masks grad_out with relu_out > 0 (relu_out: that forward's output). False, having done
  // nothing, where it does not (the CPU; NCHW on CUDA): the caller runs the plain kernels, the
  // residual add and the ReLU.
  virtual bool batch_norm_relu_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                const Tensor& running_mean, const Tensor& running_var, double momentum,
                                                double eps, const Tensor& out, const Tensor& save_mean,
                                                const Tensor& save_invstd, const Tensor& residual) = 0;
  virtual bool batch_norm_relu_backward(const Tensor& grad_out, const Tensor& relu_out, const Tensor& x,
                                        const Tensor& weight, const Tensor& mean, const Tensor& invstd,
                                        const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) = 0;

  // ---- convolution (conv.*); contiguous NCHW (CUDA also channels-last) in and out ----
  virtual void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args,
                              const Tensor& out) = 0;
  virtual void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Conv2dArgs& args,
                                     const Tensor& grad_x) = 0;
  virtual void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dArgs& args,
                                      const Tensor& grad_w) = 0;

  // ---- pooling (pool.*); contiguous NCHW in and out ----
  virtual void max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out,
                          const Tensor& indices) = 0;  // indices may be undefined
  virtual void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x) = 0;
  virtual void avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out) = 0;
  virtual void avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x) = 0;
  virtual void adaptive_avg_pool2d(const Tensor& x, const Tensor& out) = 0;
  virtual void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x) = 0;

  // ---- flash attention (attention.*) ----
  // q [B, H, L, D], k and v [B, H, S, D] (S >= 1, D <= kFlashAttentionMaxHeadDim), one dtype,
  // unit-stride head dim (16-byte aligned rows for FlashTensorCore); out [B, H, L, D] of q's
  // dtype and lse [BH, L] f32 fully overwritten. `kernel` is attention_kernel()'s choice;
  // `one_pass` flash_backward_one_pass()'s (FlashTensorCore only: dq by atomics in the dk/dv pass).
  virtual void flash_attention_forward(AttentionKernel kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                                       bool causal, double scale, const Tensor& out, const Tensor& lse) = 0;
  virtual void flash_attention_backward(AttentionKernel kernel, const Tensor& grad_out, const Tensor& q,
                                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                        bool causal, double scale, const Tensor& grad_q, const Tensor& grad_k,
                                        const Tensor& grad_v, bool one_pass) = 0;

  // ---- multi-tensor optimizer updates (optim.*); contiguous lists of one dtype ----
  virtual void adam_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) = 0;
  // 8-bit moments (t.exp_avg_absmax set): kernels/optim.h's adam8bit_multi_tensor_.
  virtual void adam8bit_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) = 0;
  virtual void sgd_multi_tensor(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& d) = 0;
  // Sum of |x|^p over all tensors (max |x| for p = inf; a NaN once seen stays), one host read.
  virtual double multi_tensor_norm_partial(const std::vector<Tensor>& ts, double norm_type) = 0;
  virtual void multi_tensor_scale(const std::vector<Tensor>& ts, double scale) = 0;
  // dst[i] = src[i] (f32 -> f16/bf16, contiguous, checked by kernels::multi_tensor_cast_).
  virtual void multi_tensor_cast(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) = 0;
  // f32 contiguous tensors of one device: total_norm (f32 [1]) = their norm, then each *= the
  // clip coefficient, with no host read (kernels/optim.h multi_tensor_clip_).
  virtual void multi_tensor_clip(const std::vector<Tensor>& ts, double max_norm, double norm_type,
                                 const Tensor& total_norm) = 0;

  // ---- mixed precision (amp.*) ----
  // Contiguous floating gradients *= inv_scale; found_inf (f32, one element) = 1 on any inf/NaN.
  // A defined `scale` (f32, one element, device memory) replaces inv_scale by 1 / scale[0].
  virtual void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, float inv_scale,
                           const Tensor& scale) = 0;
  // GradScaler.update on the device (kernels/amp.h amp_update_scale_).
  virtual void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                                const Tensor& found_inf, double growth_factor, double backoff_factor,
                                int64_t growth_interval) = 0;
  // Contiguous bf16 param += alpha * update (f32 or bf16, contiguous), stochastically rounded.
  virtual void add_stochastic_bf16(const Tensor& param, const Tensor& update, float alpha, uint64_t seed) = 0;

  // ---- FP8 (fp8.*) ----
  // out (u8, x's numel) = fp8(x * scale[0]), rounded to nearest even and saturating; x contiguous
  // f32, f16 or bf16; scale f32 [1] on x's device, read when the kernel runs.
  virtual void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& out) = 0;
  // out (contiguous f32, f16 or bf16, q's numel) = decode(q) / scale[0].
  virtual void fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& out) = 0;
  // amax (f32 [1]) = max |x| over contiguous x (NaN if any element is NaN), scale (f32 [1]) =
  // fp8_math::scale_for(amax, format, margin) and, when defined, scale_inv (f32 [1]) = 1 / scale
  // rounded once (what an FP8 GEMM multiplies by); nothing read back to the host. With `gelu`
  // the values are unary(GeluTanh, x)'s, computed in the pass (here and in the casts below).
  virtual void fp8_amax_scale(const Tensor& x, bool gelu, Fp8Format format, int margin, const Tensor& amax,
                              const Tensor& scale, const Tensor& scale_inv) = 0;
  // g = g * gelu_tanh'(pre) in place (binary(GeluTanhBackward)'s values; g and pre contiguous, of
  // one shape and dtype), then fp8_amax_scale of the new g: the FP8 MLP backward's cast of the
  // gradient reaching GELU's input, the derivative and the amax in one pass where the backend can.
  virtual void fp8_gelu_backward_amax_scale(const Tensor& g, const Tensor& pre, Fp8Format format, int margin,
                                            const Tensor& amax, const Tensor& scale, const Tensor& scale_inv) = 0;
  // fp8_quantize of a contiguous 2-D x [R, C] into out (u8 [R, C]) and its transpose out_t (u8
  // [C, R]) in one pass; either may be undefined. An FP8 GEMM reads both operands along the
  // reduced dimension, so a linear's backward needs each of x, w and the gradient transposed too.
  // col_sums, when defined (f32 [C]), gets x's column sums in f32, from the values before scaling:
  // a linear's bias gradient is the column sum of the output gradient this pass reads anyway.
  virtual void fp8_quantize_transpose(const Tensor& x, bool gelu, const Tensor& scale, Fp8Format format,
                                      const Tensor& out, const Tensor& out_t, const Tensor& col_sums) = 0;
  // fp8_quantize_transpose with delayed scaling (kernels/fp8.h, Fp8History): the scale is
  // fp8_math::scale_for(the history's max, format, margin) by history_max_bits(history, slots,
  // slot), scale_inv (f32 [1]) gets 1 / scale rounded once and scale (f32 [1], where defined) the
  // scale itself, history[slot] (zero before) gets x's amax bits and history[history_next(slot)]
  // is zeroed. history: f32 [slots] on x's device.
  // With gelu_pre defined (x's shape and dtype, contiguous) the values cast are
  // binary(GeluTanhBackward, x, gelu_pre)'s, computed in the pass (x is read, not written); with
  // `gelu` (gelu_pre undefined) unary(GeluTanh, x)'s.
  virtual void fp8_quantize_transpose_delayed(const Tensor& x, bool gelu, const Tensor& gelu_pre, const Tensor& history,
                                              int slot, Fp8Format format, int margin, const Tensor& scale,
                                              const Tensor& scale_inv, const Tensor& out, const Tensor& out_t,
                                              const Tensor& col_sums) = 0;
  // The cast `c` reserved of x (kernels::fp8_reserve_delayed: an update's FP8 weight cast, made
  // apart where the update does not write it in its own pass).
  void fp8_cast_reserved(const Tensor& x, const Fp8WeightCast& c) {
    fp8_quantize_transpose_delayed(x, false, Tensor(), c.history, c.slot, c.format, c.margin, c.scale, c.scale_inv,
                                   c.codes, c.codes_t, Tensor());
  }
  // out [M, N] (contiguous; bf16, f16 or f32) = (decode(a) @ decode(b)^T) * a_inv[0] * b_inv[0]
  // (+ bias [N] in out's dtype), accumulated in f32 and rounded once, for u8 codes a [M, K] and
  // b [N, K] (contiguous) in formats fa and fb (not both E5M2); a_inv and b_inv f32 [1] on the
  // device. False when the backend has no FP8 GEMM for these operands; kernels::fp8_gemm then
  // multiplies the decoded codes in f32. Epilogues beyond the bias are kernels::fp8_gemm's.
  // `fast_accum`: Fp8Accum::Fast's accumulation, where the device has it.
  virtual bool fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb,
                        const Tensor& b_inv, const Tensor& bias, const Tensor& out, bool fast_accum) = 0;
};

// The error for a cross-entropy label outside [0, classes) other than ignore_index: raised by
// the dispatch layer (kernels/loss.cc) for the label cross_entropy_forward returns, and by a
// backend that raises it itself (CUDA's, whose check may be read at a DeferredIndexChecks
// scope's finish()), so that both say the same words.
[[noreturn]] inline void raise_bad_label(int64_t label, int64_t classes, int64_t ignore_index) {
  MG_THROW(IndexError, "cross_entropy: target ", label, " is out of range for ", classes, " classes (expected [0, ",
           classes - 1, "] or ignore_index ", ignore_index, ")");
}

// ---- settings the backends read
// TF32 tensor-core math for f32 on CUDA (faster, ~1e-3 relative error): matmuls (cuBLAS,
// cuBLASLt), convolutions (cuDNN) and flash attention at head dims 64 and 128. Off by default,
// like PyTorch's torch.backends.cuda.matmul.allow_tf32.
inline std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline void set_allow_tf32(bool on) { tf32_flag().store(on); }
inline bool allow_tf32() { return tf32_flag().load(); }

// Deterministic kernels only, like torch.use_deterministic_algorithms: a kernel that would sum in
// a run-dependent order (f32 atomics) takes its deterministic variant instead, so repeated runs
// agree to the bit. Today that is the tensor-core attention backward, whose one pass adds dq by
// atomics and whose deterministic variant computes dq in a second pass. Off by default. Not yet
// covered (they still add by atomics): index_add with repeated indices (the embedding
// backward), the max-pooling backward over overlapping windows, the multi-tensor norm.
inline std::atomic<bool>& deterministic_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline void set_deterministic(bool on) { deterministic_flag().store(on); }
inline bool deterministic() { return deterministic_flag().load(); }

// GEMM autotuning, like PyTorch's TunableOp (PYTORCH_TUNABLEOP_ENABLED): the first cuBLASLt
// matmul of each shape, dtype and epilogue times the heuristic's top candidates on its own
// operands (a host sync, once per shape; never during CUDA graph capture) and keeps the fastest.
// Off by default; MG_GEMM_TUNE=1 in the environment turns it on at start-up. Which algorithm wins
// can differ between runs, and with it the last bits of the results; set_deterministic(true)
// turns it off.
inline std::atomic<bool>& gemm_autotune_flag() {
  static std::atomic<bool> flag{env::choice("MG_GEMM_TUNE", {"0", "1"}) == "1"};
  return flag;
}
inline void set_gemm_autotune(bool on) { gemm_autotune_flag().store(on); }
inline bool gemm_autotune() { return gemm_autotune_flag().load() && !deterministic(); }

// The backend of `device`'s type; raises mg::DeviceError naming `op` when this build has none.
Backend& backend(Device device, const char* op);
// Whether this build has kernels for `device`.
bool has_backend(Device device);
// Called once per device type at start-up (the CUDA backend registers itself when linked).
bool register_backend(DeviceType type, Backend* b);

}  // namespace mg::kernels
