// The backends' shared declaration: BackendImpl<device> overrides every op of kernels/backend.h once;
// cpu/ and cuda/ define its members per device as explicit specializations, one file per op family
// (the family file named beside each group). The contract, with its comments, is in backend.h.
#pragma once

#include "kernels/backend.h"

namespace mg::kernels {

// A tensor's data as T* (const T for an input), null for an undefined tensor (an absent
// weight or bias). Unchecked: kernels call it after dispatching on the dtype, with T possibly
// a device type (__half) that Tensor::data_ptr does not know.
template <class T>
T* data_as(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// `s` with entry `dim` set to `value` (a 0-d shape stays empty), e.g. a shape with the reduced
// dim collapsed to 1.
inline Shape with_dim(Shape s, int64_t dim, int64_t value) {
  if (!s.empty()) s[dim] = value;
  return s;
}
// Strides of `t` with the stride at `dim` zeroed: gather / scatter walk the indexed tensor
// along the index's shape, and the index supplies that coordinate.
inline Shape strides_without(const Tensor& t, int64_t dim) { return with_dim(t.strides(), dim, 0); }

// Each device's file defines `template <> void BackendImpl<DeviceType::X>::op(...)`. A device that
// lacks a definition fails to link: the class's vtable names every member. The definitions
// live in this namespace (the template's), each file's kernels in an unnamed namespace beside them.
template <DeviceType kDevice>
class BackendImpl final : public Backend {
 public:
  const char* name() const override { return kDevice == DeviceType::CPU ? "cpu" : "cuda"; }

  // ---- elementwise (elementwise.*)
  void unary(Unary op, const Tensor& a, const Tensor& out) override;
  void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void clamp(const Tensor& a, double lo, double hi, const Tensor& out) override;
  void clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi, const Tensor& out) override;
  void axpby(const Tensor& a, double alpha, const Tensor& b, double beta, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, const DropoutDraw& draw,
                        const Tensor& out, const Tensor& keep) override;
  void dropout_backward(const Tensor& grad, const Tensor& keep, double scale, const Tensor& out) override;

  // ---- reductions (reduce.*)
  void sum(const Tensor& a, const Tensor& out) override;
  void mean(const Tensor& a, const Tensor& out) override;
  void var(const Tensor& a, int64_t correction, const Tensor& out) override;
  void max_min(const Tensor& a, int64_t dim, bool is_max, const Tensor& values, const Tensor& indices) override;
  void sum_squares(const Tensor& a, const Tensor& out) override;
  bool has_nonfinite(const Tensor& a) override;

  // ---- linear algebra (linalg.*)
  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha,
            double beta) override;
  void bmm(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override;
  bool fused_linear_weight_grads(const Tensor& g, const Tensor& x, const Tensor& gw, const Tensor& gb) override;
  bool fused_linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                         const Tensor& pre) override;
  bool fused_matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre, const Tensor& g_pre) override;

  // ---- softmax family (softmax.*)
  void softmax(const Tensor& a, int64_t dim, bool log, const Tensor& out) override;
  void softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const Tensor& out) override;

  // ---- losses (loss.*)
  void nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                        const Tensor& out) override;
  int64_t cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                                const Tensor& loss, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              int64_t ignore_index, double smoothing, const Tensor& grad) override;
  int64_t cross_entropy_forward_backward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                         double smoothing, const Tensor& coef, const Tensor& loss, const Tensor& lse,
                                         const Tensor& grad) override;

  // ---- indexing (index.*)
  void one_hot(const Tensor& indices, int64_t num_classes, const Tensor& out) override;
  void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) override;
  void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add) override;
  void index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) override;
  void index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool checked) override;

  // ---- layer norm (layer_norm.*)
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                          const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                           const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                           const Tensor& grad_bias) override;
  bool fused_add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& residual_bias,
                                    const Tensor& weight, const Tensor& bias, double eps, const Tensor& sum,
                                    const Tensor& out, const Tensor& mean, const Tensor& rstd) override;
  bool fused_add_layer_norm_backward(const Tensor& grad_out, const Tensor& grad_sum, const Tensor& sum,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& grad_x,
                                     const Tensor& grad_x_low, const Tensor& grad_weight, const Tensor& grad_bias,
                                     const Tensor& grad_residual_bias) override;
  bool fused_add_layer_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& residual_bias,
                                const Tensor& weight, const Tensor& bias, double eps, DType out_dtype,
                                const Tensor& sum, const Tensor& mean, const Tensor& rstd, const Tensor& history,
                                int slot, Fp8Format format, int margin, const Tensor& scale, const Tensor& scale_inv,
                                const Tensor& out, const Tensor& out_t) override;

  // ---- batch norm (batch_norm.*)
  void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   const Tensor& running_mean, const Tensor& running_var, double momentum, double eps,
                                   const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd) override;
  void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double eps, const Tensor& out) override;
  void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& invstd, bool training, const Tensor& grad_x, const Tensor& grad_weight,
                           const Tensor& grad_bias) override;
  bool batch_norm_relu_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                        const Tensor& running_mean, const Tensor& running_var, double momentum,
                                        double eps, const Tensor& out, const Tensor& save_mean,
                                        const Tensor& save_invstd, const Tensor& residual) override;
  bool batch_norm_relu_backward(const Tensor& grad_out, const Tensor& relu_out, const Tensor& x, const Tensor& weight,
                                const Tensor& mean, const Tensor& invstd, const Tensor& grad_x,
                                const Tensor& grad_weight, const Tensor& grad_bias) override;

  // ---- convolution (conv.*)
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args,
                      const Tensor& out) override;
  void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Conv2dArgs& args,
                             const Tensor& grad_x) override;
  void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dArgs& args,
                              const Tensor& grad_w) override;

  // ---- pooling (pool.*)
  void max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out, const Tensor& indices) override;
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x) override;
  void avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out) override;
  void avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x) override;
  void adaptive_avg_pool2d(const Tensor& x, const Tensor& out) override;
  void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x) override;

  // ---- flash attention (attention.*)
  void flash_attention_forward(AttentionKernel kernel, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                               double scale, const Tensor& out, const Tensor& lse) override;
  void flash_attention_backward(AttentionKernel kernel, const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse, bool causal, double scale,
                                const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                bool one_pass) override;

  // ---- multi-tensor optimizer updates (optim.*)
  void adam_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) override;
  void adam8bit_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) override;
  void sgd_multi_tensor(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& d) override;
  double multi_tensor_norm_partial(const std::vector<Tensor>& ts, double norm_type) override;
  void multi_tensor_scale(const std::vector<Tensor>& ts, double scale) override;
  void multi_tensor_cast(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) override;
  void multi_tensor_clip(const std::vector<Tensor>& ts, double max_norm, double norm_type,
                         const Tensor& total_norm) override;

  // ---- mixed precision (amp.*)
  void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, float inv_scale,
                   const Tensor& scale) override;
  void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                        const Tensor& found_inf, double growth_factor, double backoff_factor,
                        int64_t growth_interval) override;
  void add_stochastic_bf16(const Tensor& param, const Tensor& update, float alpha, uint64_t seed) override;

  // ---- FP8 (fp8.*)
  void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& out) override;
  void fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& out) override;
  void fp8_amax_scale(const Tensor& x, bool gelu, Fp8Format format, int margin, const Tensor& amax, const Tensor& scale,
                      const Tensor& scale_inv) override;
  void fp8_gelu_backward_amax_scale(const Tensor& g, const Tensor& pre, Fp8Format format, int margin,
                                    const Tensor& amax, const Tensor& scale, const Tensor& scale_inv) override;
  void fp8_quantize_transpose(const Tensor& x, bool gelu, const Tensor& scale, Fp8Format format, const Tensor& out,
                              const Tensor& out_t, const Tensor& col_sums) override;
  void fp8_quantize_transpose_delayed(const Tensor& x, bool gelu, const Tensor& gelu_pre, const Tensor& history,
                                      int slot, Fp8Format format, int margin, const Tensor& scale,
                                      const Tensor& scale_inv, const Tensor& out, const Tensor& out_t,
                                      const Tensor& col_sums) override;
  bool fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb, const Tensor& b_inv,
                const Tensor& bias, const Tensor& out, bool fast_accum) override;
};

}  // namespace mg::kernels
