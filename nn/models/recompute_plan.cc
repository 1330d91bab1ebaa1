#include "nn/models/recompute_plan.h"

#include <algorithm>
#include <memory>

namespace mg::nn {

BlockPlan::BlockPlan(const GPTRecompute& plan, int64_t n_layer) : plan_(plan), n_layer_(n_layer) {
  opts_.keep_ops = plan.keep_ops;
  keeps_branch_ = std::find(plan.keep_ops.begin(), plan.keep_ops.end(), "gelu_mlp") != plan.keep_ops.end();
  if (plan.selective)
    selective_.emplace(plan.selective_ops.empty() ? RecomputePolicy::cheap_ops() : RecomputePolicy{plan.selective_ops});
  if (plan.offload_blocks > 0) offload_.emplace(plan.offload);
}

bool BlockPlan::norm_reads_output(int64_t i) const {
  return i + 1 == n_layer_ || !plan_.checkpointed(i + 1) || keeps_branch_;
}

Residual BlockPlan::run(int64_t i, TransformerBlock& block, const Residual& x) {
  if (i == plan_.offload_blocks) offload_.reset();
  if (plan_.units != nullptr) return run_unit(i, block, x);
  if (!plan_.checkpointed(i)) return norm_reads_output(i) ? block(x) : Residual(block.output(x));
  if (keeps_branch_) return checkpointed_with_branch(block, x);
  return checkpoint([&block](const Tensor& in) { return block.output(in); }, x.value(), opts_);
}

Residual BlockPlan::checkpointed_with_branch(TransformerBlock& block, const Residual& x) {
  // The bias the block leaves pending is read by the caller's next layer norm, outside the
  // region: decided by the forward, and the replay in backward must leave the same one.
  auto out_bias = std::make_shared<std::optional<Tensor>>();
  const std::vector<Tensor> out = checkpoint(
      [&block, in_bias = x.pending().bias, out_bias](const std::vector<Tensor>& in) {
        Residual y = block(Residual(in[0], Branch{in[1], in_bias}));
        const Tensor& bias = y.pending().bias;
        if (!out_bias->has_value()) *out_bias = bias;
        MG_CHECK(bias.defined() == (*out_bias)->defined() && (!bias.defined() || bias.is_same(**out_bias)), ValueError,
                 "BlockPlan: a checkpointed block left ", (*out_bias)->defined() ? "its" : "no",
                 " MLP bias pending in its forward but ", bias.defined() ? "one" : "none",
                 " in its replay (its c_proj was pruned or changed between the two)");
        return std::vector<Tensor>{y.base(), y.pending().out};
      },
      {x.base(), x.pending().out}, opts_);
  return Residual(out[0], Branch{out[1], out[1].defined() ? **out_bias : Tensor()});
}

Residual BlockPlan::run_unit(int64_t i, TransformerBlock& block, const Residual& x) {
  ParamUnits& units = *plan_.units;
  const auto u = static_cast<size_t>(i + 1);
  units.enter(u);
  Tensor y = plan_.checkpointed(i)
                 ? checkpoint([&block](const Tensor& in) { return block.output(in); }, x.value(), opts_)
                 : block.output(x);
  return Residual(units.leave(u, {y})[0]);
}

void BlockPlan::finish() {
  if (plan_.offload_blocks <= 0) return;
  offload_.reset();
  offload_wait();
}

}  // namespace mg::nn
