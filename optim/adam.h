// Adam and AdamW (decoupled weight decay, amsgrad) with torch.optim's update rules; on CUDA
// every group's f32 parameters are updated by fused multi-tensor launches (kernels/optim.h).
#pragma once

#include <unordered_map>
#include <vector>

#include "optim/optimizer.h"

namespace mg::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
  // Fused multi-tensor update for every parameter it supports (contiguous f32, or f64 on the
  // CPU); false sends every parameter through the per-parameter path (one kernel per op per
  // parameter), which is PyTorch's foreach=False and the baseline bench/optim_bench measures.
  bool fused = true;
  // Capturable (optim/optimizer.h): the lr and step counts in device memory, so the step can run
  // inside a CUDA graph and be skipped on the device by a GradScaler. Needs the fused path for
  // every parameter.
  bool capturable = false;
  // On the fused path, also write the next autocast region's low-precision copy of each f32
  // parameter that region will cast (the ones the last region cast: autocast::
  // weights_cast_next_region), in the update's own kernel: 2 bytes a parameter more there
  // instead of a cast kernel reading 4 and writing 2 at the region's start, and no host work
  // before the forward's first GEMM. The copies are handed to the autocast cache
  // (autocast::provide_cast) and live from the step until that region exits, where casts made
  // by the region would live from its start; memory stats count them as activations, as they
  // count a forward's casts. Likewise the FP8 recipe's weight casts (autograd/fp8_linear.h,
  // fp8_next_weight_cast): for each f32 weight its layers cast under delayed scaling, the e4m3
  // codes and their transpose (2 bytes a parameter) written from the new values in the update's
  // pass, instead of a cast reading the f32 weight again in the next forward. Off in capturable
  // mode (a captured step casts in its graph).
  bool write_autocast_casts = true;
  // 8: 8-bit optimizer state. The moments of every contiguous f32 parameter with at least
  // min_8bit_size elements are kept as blockwise-quantized codes (one byte an element and one f32
  // scale per 2048: kernels/optim.h, adam8bit_multi_tensor_), 2 bytes a parameter instead of 8;
  // smaller parameters (biases, norms) keep f32 moments, as bitsandbytes does. The f32 parameter
  // (the master weight) and its update stay f32. Needs fused, no amsgrad. 32: f32 moments.
  int state_bits = 32;
  int64_t min_8bit_size = 4096;
};

// Per parameter p with gradient g, step t (counted per parameter), group options
// lr, betas (b1, b2), eps, wd:
//   g = maximize ? -g : g
//   Adam:  g = g + wd * p              AdamW: p = p * (1 - lr * wd)
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2;  (amsgrad: vmax = max(vmax, v))
//   p = p - lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)
// State "exp_avg", "exp_avg_sq" (+ "max_exp_avg_sq") is created on the first step that sees a
// gradient, under MemoryCategory::OptimizerState. A bf16 parameter (pure-bf16 training) keeps
// its state in f32 and gets the f32 update added with stochastic rounding
// (optim/bf16_update.h). Group options: "lr", "beta1", "beta2", "eps",
// "weight_decay", "amsgrad" (0/1), "maximize" (0/1).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions defaults);
  Adam(std::vector<ParamGroup> groups, AdamOptions defaults);
  void step() override;
  // Where the fused update also writes p's new value rounded to nearest in dst's dtype (f16 or
  // bf16, p's shape, contiguous, on p's device), in the same pass as the update and in place of
  // the cast for autocast's next region: a cast its owner keeps (memory/host_params.h keeps the
  // pinned casts the device copies). dst's version moves when a step wrote it; a parameter that
  // takes the per-parameter path leaves it as it was. An undefined dst removes p's target.
  void set_cast_target(const Tensor& p, Tensor dst);
  // True when a step reads an f16/bf16 gradient of an f32 CPU parameter as it is, widening it
  // inside the fused update (fused, not capturable); otherwise such a gradient is cast first.
  bool widens_16bit_grads() const { return fused_ && !capturable(); }

 protected:
  Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions defaults, bool decoupled);
  void validate(const ParamGroup& group) const override;
  StateSpec state_spec(const std::map<std::string, double>& options, const Tensor& param) const override;
  // AdamW's state into AdamW8bit (the moments quantized as a step would store them) and
  // AdamW8bit's into AdamW (the codes read back to f32): a checkpoint of either resumes in the other.
  std::optional<StateDict> converted_state_dict(const StateDict& sd, const std::string& saved_type) const override;

 private:
  // The weights whose next autocast cast this step writes (AdamOptions::write_autocast_casts).
  std::unordered_map<const TensorImpl*, DType> next_region_casts() const;
  // Whether p's moments are kept in 8 bits (AdamOptions::state_bits).
  bool quantized(const Tensor& p) const;

  std::unordered_map<const TensorImpl*, Tensor> cast_targets_;
  bool decoupled_;
  bool fused_;
  bool write_autocast_casts_;
  int state_bits_;
  int64_t min_8bit_size_;
};

// AdamW: Adam with decoupled weight decay (default 1e-2, like torch.optim.AdamW).
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions defaults = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});
};

// AdamW with 8-bit moments (AdamOptions::state_bits = 8): bitsandbytes' AdamW8bit. Its state
// dict names itself "AdamW8bit" and holds, per quantized parameter, "exp_avg" and "exp_avg_sq"
// (u8 codes, the parameter's shape) and "exp_avg_absmax" and "exp_avg_sq_absmax" (f32, one a block).
struct AdamW8bitOptions : AdamWOptions {
  AdamW8bitOptions() { state_bits = 8; }
};

class AdamW8bit : public Adam {
 public:
  AdamW8bit(std::vector<Tensor> params, AdamW8bitOptions defaults = {});
  AdamW8bit(std::vector<ParamGroup> groups, AdamW8bitOptions defaults = {});
};

}  // namespace mg::optim
