// Tensor parallelism (Megatron-LM style): a Linear's weight split across ranks, each shard on
// its own rank's device. Column-parallel splits the output features, row-parallel the input
// features; the four region functions below are the differentiable collectives between them.
#pragma once

#include <memory>
#include <string>

#include "core/random.h"
#include "distributed/process_group.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/transformer.h"

namespace mg::dist {

// Forward: identity. Backward: all-reduce(sum) of the gradient (each rank's input gradient is
// a partial sum over its output shard).
Tensor copy_to_tensor_parallel_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& pg);
// Forward: all-reduce(sum) (the row-parallel partial products). Backward: identity.
Tensor reduce_from_tensor_parallel_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& pg);
// Forward: this rank's chunk of the last dim. Backward: all-gather along the last dim.
Tensor scatter_to_tensor_parallel_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& pg);
// Forward: all-gather along the last dim. Backward: this rank's chunk of the gradient.
Tensor gather_from_tensor_parallel_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& pg);

// What the column- and row-parallel layers share: the full layer's sizes, this rank's shard of
// the weight (split along `split_dim`: 0 = output features, 1 = input features) and the bias.
class ParallelLinear : public nn::Module {
 public:
  std::string extra_repr() const override;

  const int64_t in_features, out_features;
  const int64_t split_dim;  // of the weight: 0 (output features) or 1 (input features)
  const int64_t per_rank;   // features of the split dim held by this rank
  Tensor& weight;           // [out / N, in] (column-parallel) or [out, in / N] (row-parallel)
  Tensor& bias;             // column-parallel: [out / N]; row-parallel: [out], the same on every rank

 protected:
  // Shards `full` (unsharded, identical on every rank) onto `device`. The bias is split with
  // the output features and replicated otherwise.
  ParallelLinear(const char* name, const nn::Linear& full, std::shared_ptr<ProcessGroup> pg, Device device,
                 int64_t split_dim);
  std::shared_ptr<ProcessGroup> pg_;
};

// y = x @ W^T + b with W's rows (output features) split: rank r holds W[r*o/N:(r+1)*o/N, :]
// and that slice of b. The output is this rank's slice of y, or all of y (gather_output).
class ColumnParallelLinear : public ParallelLinear {
 public:
  // Every rank draws the full weight with the same generator and keeps its slice, so the
  // layer equals nn::Linear(in, out, bias, opts, gen) with the same seed. out % world == 0.
  ColumnParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<ProcessGroup> pg, bool bias = true,
                       bool gather_output = true, TensorOptions opts = {}, Generator* gen = nullptr);
  // Shards an existing (unsharded, identical on every rank) Linear onto `device`.
  ColumnParallelLinear(const nn::Linear& full, std::shared_ptr<ProcessGroup> pg, bool gather_output, Device device);
  Tensor forward(const Tensor& x) override;

  std::string extra_repr() const override;

  const bool gather_output;
};

// y = x @ W^T + b with W's columns (input features) split: rank r holds W[:, r*i/N:(r+1)*i/N].
// The input is this rank's slice of x (input_is_parallel, e.g. a ColumnParallelLinear's
// output) or all of x (then sliced here); partial products are all-reduced, then the full
// bias (replicated) is added once.
class RowParallelLinear : public ParallelLinear {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<ProcessGroup> pg, bool bias = true,
                    bool input_is_parallel = false, TensorOptions opts = {}, Generator* gen = nullptr);
  RowParallelLinear(const nn::Linear& full, std::shared_ptr<ProcessGroup> pg, bool input_is_parallel, Device device);
  Tensor forward(const Tensor& x) override;

  std::string extra_repr() const override;

  const bool input_is_parallel;
};

// GPT-2's MLP with the hidden layer split across ranks: c_fc column-parallel (no gather),
// GELU on the local slice, c_proj row-parallel (input already split): one all-reduce in
// forward, one in backward. Parameter names match nn::MLP.
class TensorParallelMLP : public nn::Module {
 public:
  TensorParallelMLP(const nn::TransformerBlockOptions& o, std::shared_ptr<ProcessGroup> pg, TensorOptions opts = {},
                    Generator* gen = nullptr);
  // Shards an existing nn::MLP (identical on every rank) onto `device`.
  TensorParallelMLP(const nn::MLP& full, std::shared_ptr<ProcessGroup> pg, Device device);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<ColumnParallelLinear> c_fc;
  std::shared_ptr<nn::GELU> gelu;
  std::shared_ptr<RowParallelLinear> c_proj;
  std::shared_ptr<nn::Dropout> dropout;
};

}  // namespace mg::dist
