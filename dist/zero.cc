// ZeRO-1: the flat index space, the copies between parameters and this rank's shard, and the
// step (gradients in, local update, chunked all-gather of the updated parameters out).
#include "dist/zero.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "kernels/ops.h"
#include "nn/module.h"

namespace mg::dist {

namespace {
Tensor flat_slice(const Tensor& t, int64_t begin, int64_t len) {
  return raw::slice(raw::view(t, {t.numel()}), 0, begin, begin + len, 1);
}
}  // namespace

template <class F>
void ZeroRedundancyOptimizer::for_each_piece(int64_t begin, int64_t end, F&& fn) const {
  end = std::min(end, total_);
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), begin);
  size_t i = it == offsets_.begin() ? 0 : static_cast<size_t>(it - offsets_.begin() - 1);
  for (; i < params_.size() && offsets_[i] < end; ++i) {
    const int64_t p_begin = offsets_[i], p_end = p_begin + params_[i].numel();
    const int64_t a = std::max(begin, p_begin), b = std::min(end, p_end);
    if (a < b) fn(i, a - p_begin, a - begin, b - a);
  }
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> pg,
                                                 const Factory& make_local, ZeroOptions opts)
    : params_(std::move(params)), pg_(std::move(pg)), opts_(opts) {
  MG_CHECK(pg_ != nullptr, ValueError, "ZeroRedundancyOptimizer: process group is null");
  MG_CHECK(!params_.empty(), ValueError, "ZeroRedundancyOptimizer: got no parameters");
  MG_CHECK(opts.chunk_mb > 0, ValueError, "ZeroRedundancyOptimizer: chunk_mb must be positive, got ", opts.chunk_mb);
  const DType dtype = params_[0].dtype();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined() && p.is_contiguous(), ValueError, "ZeroRedundancyOptimizer: parameter ", i,
             " must be a defined, contiguous tensor");
    MG_CHECK(p.dtype() == dtype, DTypeError, "ZeroRedundancyOptimizer: parameter ", i, " is ", p.dtype(),
             ", parameter 0 is ", dtype, " (one flat space needs one dtype)");
    MG_CHECK(p.device() == pg_->device(), DeviceError, "ZeroRedundancyOptimizer: parameter ", i, " is on ",
             p.device(), " but the process group works on ", pg_->device());
    offsets_.push_back(total_);
    total_ += p.numel();
  }
  const int64_t N = pg_->size();
  const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>(opts.chunk_mb * 1048576.0) / dtype_size(dtype));
  const int64_t per_rank_cap = std::max<int64_t>(1, elems / N);
  for (int64_t g = 0; g < total_;) {
    const int64_t per_rank = std::min(per_rank_cap, (total_ - g + N - 1) / N);
    chunks_.push_back({g, per_rank, shard_numel_});
    shard_numel_ += per_rank;
    g += per_rank * N;
  }
  {
    NoGradGuard ng;
    MemoryCategoryGuard cat(MemoryCategory::Parameters);
    shard_ = zeros({shard_numel_}, {dtype, pg_->device()});
    for (const Chunk& c : chunks_) {
      const int64_t begin = c.global_begin + pg_->rank() * c.per_rank;
      for_each_piece(begin, begin + c.per_rank, [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
        kernels::copy_(flat_slice(shard_, c.local_begin + r_off, len), flat_slice(params_[i], p_off, len));
      });
    }
    shard_ = nn::parameter(shard_);
  }
  {
    MemoryCategoryGuard cat(MemoryCategory::Gradients);
    shard_grad_ = zeros({shard_numel_}, {dtype, pg_->device()});
  }
  local_ = make_local({shard_});
  MG_CHECK(local_ != nullptr, ValueError, "ZeroRedundancyOptimizer: the factory returned no optimizer");
}

void ZeroRedundancyOptimizer::step() {
  NoGradGuard ng;
  const int64_t N = pg_->size(), rank = pg_->rank();
  // 1. This rank's slice of the (averaged) gradients.
  kernels::fill_(shard_grad_, 0.0);
  for (const Chunk& c : chunks_) {
    Tensor mine = flat_slice(shard_grad_, c.local_begin, c.per_rank);
    if (opts_.reduce_gradients) {
      MemoryCategoryGuard cat(MemoryCategory::Gradients);
      Tensor full = zeros({c.per_rank * N}, {shard_grad_.dtype(), pg_->device()});
      for_each_piece(c.global_begin, c.global_begin + c.per_rank * N,
                     [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
                       Tensor g = params_[i].grad();
                       if (g.defined())
                         kernels::copy_(flat_slice(full, r_off, len), flat_slice(raw::contiguous(g), p_off, len));
                     });
      pg_->reduce_scatter(mine, full, ReduceOp::Avg);
    } else {
      const int64_t begin = c.global_begin + rank * c.per_rank;
      for_each_piece(begin, begin + c.per_rank, [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
        Tensor g = params_[i].grad();
        if (g.defined()) kernels::copy_(flat_slice(mine, r_off, len), flat_slice(raw::contiguous(g), p_off, len));
      });
    }
  }
  shard_.set_grad(shard_grad_);
  // 2. The local update (optimizer state for this slice only).
  local_->step();
  // 3. Everyone's updated slices back into every parameter, one chunk at a time.
  for (const Chunk& c : chunks_) {
    Tensor gathered = empty({c.per_rank * N}, {shard_.dtype(), pg_->device()});
    pg_->all_gather(gathered, flat_slice(shard_.detach(), c.local_begin, c.per_rank));
    for_each_piece(c.global_begin, c.global_begin + c.per_rank * N,
                   [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
                     kernels::copy_(flat_slice(params_[i], p_off, len), flat_slice(gathered, r_off, len));
                   });
  }
  for (const Tensor& p : params_) p.bump_version();
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) {
    if (set_to_none) {
      p.set_grad(Tensor());
    } else if (p.grad().defined()) {
      kernels::fill_(p.grad(), 0.0);
    }
  }
}

}  // namespace mg::dist
