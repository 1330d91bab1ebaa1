// Tensor-parallel layers. Each region function runs its collective in forward and records a
// node whose backward runs the matching one (the conjugate: all-reduce <-> identity,
// all-gather <-> slice), so gradients are exact without any extra bookkeeping.
#include "distributed/tensor_parallel.h"

#include <sstream>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "kernels/ops.h"

namespace mg::dist {

namespace {
using PG = std::shared_ptr<ProcessGroup>;

int64_t split(int64_t n, const PG& pg, const char* layer, const char* what) {
  MG_CHECK(pg != nullptr, ValueError, layer, ": process group is null");
  MG_CHECK(n > 0 && n % pg->size() == 0, ValueError, layer, ": ", what, " (", n,
           ") must be a positive multiple of the world size (", pg->size(), ")");
  return n / pg->size();
}

// This rank's chunk of the last dim (contiguous, its own storage).
Tensor chunk_last(const Tensor& x, const PG& pg, const char* op) {
  const int64_t d = x.dim() - 1;
  MG_CHECK(x.dim() >= 1 && x.size(d) % pg->size() == 0, ShapeError, op, ": last dim of shape ", shape_str(x.sizes()),
           " is not divisible by the world size ", pg->size());
  const int64_t n = x.size(d) / pg->size();
  return raw::clone(raw::slice(x, d, pg->rank() * n, (pg->rank() + 1) * n, 1));
}

// Every rank's x, concatenated along the last dim in rank order.
Tensor gather_last(const Tensor& x, const PG& pg) {
  if (pg->size() == 1) return raw::clone(x);
  Tensor all = pg->all_gather(raw::contiguous(x));  // [N, *x.shape]
  std::vector<Tensor> parts;
  for (int r = 0; r < pg->size(); ++r) parts.push_back(raw::select(all, 0, r));
  return kernels::cat(parts, x.dim() - 1);
}

Tensor sum_over_ranks(const Tensor& x, const PG& pg) {
  Tensor out = raw::clone(x);
  pg->all_reduce(out, ReduceOp::Sum);
  return out;
}

Tensor make_shard(const Tensor& t, Device device) {
  MemoryCategoryGuard cat(MemoryCategory::Parameters);
  return raw::to_device(raw::clone(t), device);
}

// Rank r's n entries along `dim`.
Tensor shard(const Tensor& t, int64_t dim, int rank, int64_t n) {
  return raw::slice(t, dim, rank * n, (rank + 1) * n, 1);
}

// Both layers equal nn::Linear(in, out, bias, opts, gen) with the same seed: every rank draws
// the full weight on the CPU and keeps its shard.
nn::Linear full_linear(int64_t in, int64_t out, bool with_bias, const TensorOptions& opts, Generator* gen) {
  return nn::Linear(in, out, with_bias, {opts.dtype, Device::cpu()}, gen);
}
}  // namespace

Tensor copy_to_tensor_parallel_region(const Tensor& x, const PG& pg) {
  Tensor out = x.detach();
  autograd::record("copy_to_tensor_parallel_region", {x}, out,
                   [pg](const std::vector<Tensor>& g) { return std::vector<Tensor>{sum_over_ranks(g[0], pg)}; });
  return out;
}

Tensor reduce_from_tensor_parallel_region(const Tensor& x, const PG& pg) {
  Tensor out = sum_over_ranks(x, pg);
  autograd::record("reduce_from_tensor_parallel_region", {x}, out,
                   [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor scatter_to_tensor_parallel_region(const Tensor& x, const PG& pg) {
  Tensor out = chunk_last(x, pg, "scatter_to_tensor_parallel_region");
  autograd::record("scatter_to_tensor_parallel_region", {x}, out,
                   [pg](const std::vector<Tensor>& g) { return std::vector<Tensor>{gather_last(g[0], pg)}; });
  return out;
}

Tensor gather_from_tensor_parallel_region(const Tensor& x, const PG& pg) {
  Tensor out = gather_last(x, pg);
  autograd::record("gather_from_tensor_parallel_region", {x}, out, [pg](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{chunk_last(g[0], pg, "gather_from_tensor_parallel_region backward")};
  });
  return out;
}

// ---------------- ParallelLinear ----------------

ParallelLinear::ParallelLinear(const char* name, const nn::Linear& full, PG pg, Device device, int64_t dim)
    : nn::Module(name),
      in_features(full.in_features),
      out_features(full.out_features),
      split_dim(dim),
      per_rank(
          split(dim == 0 ? full.out_features : full.in_features, pg, name, dim == 0 ? "out_features" : "in_features")),
      weight(register_parameter("weight", make_shard(shard(full.weight, dim, pg->rank(), per_rank), device))),
      // The bias follows the output features: split with them, replicated otherwise.
      bias(register_parameter("bias",
                              full.bias.defined()
                                  ? make_shard(dim == 0 ? shard(full.bias, 0, pg->rank(), per_rank) : full.bias, device)
                                  : Tensor())),
      pg_(std::move(pg)) {}

std::string ParallelLinear::extra_repr() const {
  std::ostringstream os;
  os << "in=" << in_features << ", out=" << out_features << " (" << per_rank << (split_dim == 0 ? " out" : " in")
     << " on rank " << pg_->rank() << ")";
  return os.str();
}

// ---------------- ColumnParallelLinear ----------------

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, PG pg, bool with_bias, bool gather,
                                           TensorOptions opts, Generator* gen)
    : ColumnParallelLinear(full_linear(in, out, with_bias, opts, gen), std::move(pg), gather, opts.device) {}

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, PG pg, bool gather, Device device)
    : ParallelLinear("ColumnParallelLinear", full, std::move(pg), device, /*dim=*/0), gather_output(gather) {}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  Tensor y = linear(copy_to_tensor_parallel_region(x, pg_), weight, bias);
  return gather_output ? gather_from_tensor_parallel_region(y, pg_) : y;
}

std::string ColumnParallelLinear::extra_repr() const {
  return ParallelLinear::extra_repr() + ", gather_output=" + (gather_output ? "true" : "false");
}

// ---------------- RowParallelLinear ----------------

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, PG pg, bool with_bias, bool parallel_in,
                                     TensorOptions opts, Generator* gen)
    : RowParallelLinear(full_linear(in, out, with_bias, opts, gen), std::move(pg), parallel_in, opts.device) {}

RowParallelLinear::RowParallelLinear(const nn::Linear& full, PG pg, bool parallel_in, Device device)
    : ParallelLinear("RowParallelLinear", full, std::move(pg), device, /*dim=*/1), input_is_parallel(parallel_in) {}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor local = input_is_parallel ? x : scatter_to_tensor_parallel_region(x, pg_);
  MG_CHECK(local.dim() >= 1 && local.size(-1) == per_rank, ShapeError, "RowParallelLinear: expected ",
           input_is_parallel ? "this rank's input slice" : "an input", " with last dim ",
           input_is_parallel ? per_rank : in_features, ", got shape ", shape_str(x.sizes()));
  Tensor y = reduce_from_tensor_parallel_region(linear(local, weight), pg_);
  return bias.defined() ? add(y, bias) : y;
}

std::string RowParallelLinear::extra_repr() const {
  return ParallelLinear::extra_repr() + ", input_is_parallel=" + (input_is_parallel ? "true" : "false");
}

// ---------------- TensorParallelMLP ----------------

TensorParallelMLP::TensorParallelMLP(const nn::TransformerBlockOptions& o, PG pg, TensorOptions opts, Generator* gen)
    : nn::Module("TensorParallelMLP") {
  MG_CHECK(o.mlp_ratio > 0, ValueError, "TensorParallelMLP: mlp_ratio must be positive, got ", o.mlp_ratio);
  // Same draw order as nn::MLP (c_fc, then c_proj), so equal seeds give equal layers.
  c_fc = register_module(
      "c_fc", std::make_shared<ColumnParallelLinear>(o.n_embd, o.mlp_ratio * o.n_embd, pg, o.bias, false, opts, gen));
  gelu = register_module("gelu", std::make_shared<nn::GELU>(o.gelu_approximate));
  c_proj = register_module(
      "c_proj", std::make_shared<RowParallelLinear>(o.mlp_ratio * o.n_embd, o.n_embd, pg, o.bias, true, opts, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(o.dropout));
}

TensorParallelMLP::TensorParallelMLP(const nn::MLP& full, PG pg, Device device) : nn::Module("TensorParallelMLP") {
  c_fc = register_module("c_fc", std::make_shared<ColumnParallelLinear>(*full.c_fc, pg, false, device));
  gelu = register_module("gelu", std::make_shared<nn::GELU>(full.gelu->approximate));
  c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(*full.c_proj, pg, true, device));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(full.dropout->p));
}

Tensor TensorParallelMLP::forward(const Tensor& x) { return (*dropout)((*c_proj)((*gelu)((*c_fc)(x)))); }

}  // namespace mg::dist
