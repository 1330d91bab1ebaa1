#include "distributed/fully_shard.h"

#include <cmath>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "distributed/zero.h"
#include "core/allocator.h"
#include "kernels/ops.h"
#include "nn/module.h"

namespace mg::dist {

ShardSource::ShardSource(std::shared_ptr<ProcessGroup> pg, int max_reductions_in_flight)
    : pg_(std::move(pg)), max_in_flight_(max_reductions_in_flight) {
  MG_CHECK(pg_ != nullptr, ValueError, "ShardSource: no process group");
  MG_CHECK(max_in_flight_ >= 1, ValueError, "ShardSource: max_reductions_in_flight must be >= 1, got ", max_in_flight_);
}

void ShardSource::adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) {
  if (shards_.size() <= unit) shards_.resize(unit + 1);
  MG_CHECK(shards_[unit].size() == group, ValueError, "ShardSource: unit ", unit, " group ", group,
           " adopted out of order");
  const int64_t n = layout.padded / pg_->size(), r = pg_->rank();
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::Parameters);
  Tensor shard = raw::to_device(raw::clone(raw::slice(values, 0, r * n, (r + 1) * n, 1)), pg_->device());
  shard.requires_grad_(true);
  shards_[unit].push_back(shard);
}

std::function<void()> ShardSource::fetch(size_t unit, size_t group, const Tensor& dst) {
  const Tensor& master = shards_.at(unit).at(group);
  Tensor src;
  {
    NoGradGuard ng;
    MemoryCategoryGuard cat(MemoryCategory::Gathered);
    src = dst.dtype() == master.dtype() ? master.detach() : kernels::cast(master, dst.dtype());
  }
  WorkPtr work = pg_->all_gather_async(dst, src);
  return [work, src] { work->wait(); };  // src stays alive until the gather has read it
}

void ShardSource::complete(Pending& p) {
  p.work->wait();
  NoGradGuard ng;
  const Tensor& master = shards_[p.unit][p.group];
  Tensor g = master.grad();
  Tensor add = p.out.dtype() == master.dtype() ? p.out : kernels::cast(p.out, master.dtype());
  master.set_grad(g.defined() ? kernels::add(g, add) : add);
  p = Pending{};
}

void ShardSource::reduce(size_t unit, size_t group, Tensor grad) {
  NoGradGuard ng;
  // Earlier reductions that finished, or the oldest when too many are in flight: each holds a
  // unit's full gradient until it completes.
  while (!pending_.empty() &&
         (pending_.front().work->completed() || static_cast<int>(pending_.size()) >= max_in_flight_)) {
    complete(pending_.front());
    pending_.erase(pending_.begin());
  }
  const Tensor& master = shards_.at(unit).at(group);
  MemoryCategoryGuard cat(MemoryCategory::Gradients);
  // Reduced in f32 (or the master's wider dtype): a bf16 sum over ranks would round each add.
  Tensor in = grad.dtype() == master.dtype() ? grad : kernels::cast(grad, master.dtype());
  Tensor out = empty({master.numel()}, TensorOptions(master.dtype(), master.device()));
  pending_.push_back(Pending{pg_->reduce_scatter_async(out, in, ReduceOp::Avg), out, in, unit, group});
  ++reductions_;
}

void ShardSource::end_backward() {
  for (Pending& p : pending_) complete(p);
  pending_.clear();
}

std::vector<Tensor> ShardSource::shards() const {
  std::vector<Tensor> out;
  for (const auto& unit : shards_)
    for (const Tensor& s : unit) out.push_back(s);
  return out;
}

double ShardSource::clip_grad_norm_(double max_norm) {
  end_backward();  // the reductions still in flight
  std::vector<Tensor> grads;
  for (const Tensor& s : shards())
    if (s.grad().defined()) grads.push_back(s.grad());
  return clip_sharded_grad_norm_(grads, *pg_, max_norm, "ShardSource::clip_grad_norm_");
}

namespace {
struct Place {
  size_t unit, group;
  int64_t offset;
};
std::unordered_map<const TensorImpl*, Place> places(const ParamUnits& units) {
  std::unordered_map<const TensorImpl*, Place> out;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t g = 0; g < units.groups(u).size(); ++g) {
      const UnitGroup& grp = units.groups(u)[g];
      for (size_t k = 0; k < grp.params.size(); ++k) out[grp.params[k].impl()] = Place{u, g, grp.offsets[k]};
    }
  return out;
}
}  // namespace

StateDict FullyShardedModel::full_state_dict(const nn::Module& model) const {
  NoGradGuard ng;
  const auto where = places(*units);
  ProcessGroup& pg = source->process_group();
  // One all-gather a group, in unit order (every rank walks the same units).
  std::vector<std::vector<Tensor>> full(units->size());
  for (size_t u = 0; u < units->size(); ++u)
    for (size_t g = 0; g < units->groups(u).size(); ++g) {
      const Tensor& s = source->shard(u, g);
      Tensor out = empty({s.numel() * pg.size()}, TensorOptions(s.dtype(), s.device()));
      pg.all_gather(out, s.detach());
      full[u].push_back(out);
    }
  StateDict sd;
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = where.find(p.impl());
    if (it == where.end()) {
      sd.tensors[name] = raw::clone(p.detach());  // a parameter no unit holds
      continue;
    }
    const Place& pl = it->second;
    sd.tensors[name] = raw::reshape(
        raw::clone(raw::slice(full[pl.unit][pl.group], 0, pl.offset, pl.offset + p.numel(), 1)), p.sizes());
  }
  return sd;
}

void FullyShardedModel::load_full_state_dict(const nn::Module& model, const StateDict& sd) {
  NoGradGuard ng;
  const auto where = places(*units);
  ProcessGroup& pg = source->process_group();
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = where.find(p.impl());
    if (it == where.end()) continue;
    auto t = sd.tensors.find(name);
    MG_CHECK(t != sd.tensors.end(), ValueError, "fully_shard load_full_state_dict: the state dict has no \"", name,
             "\"");
    MG_CHECK(t->second.sizes() == p.sizes(), ValueError, "fully_shard load_full_state_dict: \"", name, "\" is ",
             shape_str(t->second.sizes()), " in the state dict, ", shape_str(p.sizes()), " in the model");
    const Place& pl = it->second;
    const Tensor& s = source->shard(pl.unit, pl.group);
    const int64_t n = s.numel(), lo = pg.rank() * n, hi = lo + n;
    // The part of [offset, offset + numel) inside this rank's [lo, hi).
    const int64_t b = std::max(lo, pl.offset), e = std::min(hi, pl.offset + p.numel());
    if (b >= e) continue;
    Tensor flat = raw::reshape(t->second, {-1});
    raw::copy_(raw::slice(s, 0, b - lo, e - lo, 1), raw::slice(flat, 0, b - pl.offset, e - pl.offset, 1));
  }
}

FullyShardedModel fully_shard(std::vector<std::vector<Tensor>> units, std::shared_ptr<ProcessGroup> pg,
                              FullyShardOptions opts) {
  FullyShardedModel m;
  m.source = std::make_shared<ShardSource>(pg);
  ParamUnitsOptions po;
  po.device = pg->device();
  po.prefetch = opts.prefetch;
  for (size_t k : opts.keep)
    if (k < units.size()) po.keep.push_back(k);
  po.dtype = std::move(opts.dtype);
  m.units = std::make_unique<ParamUnits>(std::move(units), m.source, po);
  return m;
}

}  // namespace mg::dist
