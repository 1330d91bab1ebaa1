#include "autograd/param_units.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "core/profiler.h"
#include "kernels/ops.h"

namespace mg {

ParamUnits::ParamUnits(std::vector<std::vector<Tensor>> units, std::shared_ptr<ParamSource> source,
                       ParamUnitsOptions opts)
    : source_(std::move(source)), opts_(std::move(opts)) {
  const char* op = "ParamUnits";
  MG_CHECK(source_ != nullptr, ValueError, op, ": no parameter source");
  MG_CHECK(opts_.prefetch >= 0, ValueError, op, ": prefetch must be >= 0, got ", opts_.prefetch);
  const int64_t pad = source_->pad_multiple();
  MG_CHECK(pad >= 1, ValueError, op, ": the source's pad multiple must be >= 1, got ", pad);
  std::unordered_set<const TensorImpl*> seen;
  units_.resize(units.size());
  for (size_t k : opts_.keep) {
    MG_CHECK(k < units.size(), IndexError, op, ": kept unit ", k, " out of range for ", units.size(), " units");
    units_[k].kept = true;
  }
  NoGradGuard ng;
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& un = units_[u];
    for (size_t i = 0; i < units[u].size(); ++i) {
      const Tensor& p = units[u][i];
      MG_CHECK(p.defined() && is_floating(p.dtype()) && p.is_leaf() && p.is_contiguous() && !p.grad().defined() &&
                   !storage_released(p.storage()),
               ValueError, op, ": unit ", u, " parameter ", i,
               " must be a contiguous floating leaf with its values and no gradient; got ",
               p.defined()
                   ? detail::format(p.dtype(), " ", shape_str(p.sizes()), p.grad().defined() ? " with a gradient" : "")
                   : std::string("undefined"));
      MG_CHECK(seen.insert(p.impl()).second, ValueError, op, ": unit ", u, " parameter ", i, " (shape ",
               shape_str(p.sizes()), ") is listed twice (each parameter belongs to one unit)");
      const DType dt = opts_.dtype ? opts_.dtype(p) : p.dtype();
      MG_CHECK(is_floating(dt), DTypeError, op, ": parameters are materialized in a floating dtype, got ", dt);
      auto g = std::find_if(un.groups.begin(), un.groups.end(), [&](const UnitGroup& x) { return x.dtype == dt; });
      if (g == un.groups.end()) g = un.groups.insert(un.groups.end(), UnitGroup{dt, p.dtype()});
      MG_CHECK(g->master_dtype == p.dtype(), DTypeError, op, ": unit ", u, " parameter ", i, " is ", p.dtype(),
               ", its group's others ", g->master_dtype, " (one master dtype a group)");
      g->offsets.push_back(g->numel);
      g->params.push_back(p);
      g->numel += p.numel();
    }
    for (size_t gi = 0; gi < un.groups.size(); ++gi) {
      UnitGroup& g = un.groups[gi];
      g.padded = (g.numel + pad - 1) / pad * pad;
      const Device from = g.params[0].device();
      Tensor values = zeros({g.padded}, TensorOptions(g.master_dtype, from));
      for (size_t k = 0; k < g.params.size(); ++k) {
        MG_CHECK(g.params[k].device() == from, DeviceError, op, ": unit ", u, " holds parameters on ", from, " and ",
                 g.params[k].device());
        raw::copy_(raw::slice(values, 0, g.offsets[k], g.offsets[k] + g.params[k].numel(), 1),
                   raw::view(g.params[k], {-1}));
      }
      source_->adopt(u, gi, g, values);
      {
        MemoryCategoryGuard cat(MemoryCategory::Gathered);
        g.flat = empty({g.padded}, TensorOptions(g.dtype, opts_.device));
      }
      for (size_t k = 0; k < g.params.size(); ++k)
        retarget(g.params[k], raw::view(raw::slice(g.flat, 0, g.offsets[k], g.offsets[k] + g.params[k].numel(), 1),
                                        g.params[k].sizes()));
      release_storage(g.flat.storage());
    }
    // The sinks: a parameter's gradient lands in its group's gradient buffer, on the device.
    size_t idx = 0;
    for (size_t gi = 0; gi < un.groups.size(); ++gi)
      for (size_t k = 0; k < un.groups[gi].params.size(); ++k, ++idx) {
        const Tensor& p = un.groups[gi].params[k];
        if (!p.requires_grad()) continue;
        ++un.trainable;
        autograd::set_gradient_sink(
            p, opts_.device, [this, u, gi, k](const Tensor&, Tensor g) { on_gradient(u, gi, k, g); },
            un.groups[gi].master_dtype);
      }
    un.got.assign(idx, 0);
    un.grads.resize(un.groups.size());
  }
}

ParamUnits::~ParamUnits() {
  for (Unit& un : units_)
    for (UnitGroup& g : un.groups)
      for (const Tensor& p : g.params) autograd::clear_gradient_sink(p);
  for (size_t u = 0; u < units_.size(); ++u) {
    try {
      release(u);
    } catch (...) {  // a fetch that failed: its error was the caller's to see
    }
  }
}

int64_t ParamUnits::unit_bytes(size_t u) const {
  int64_t n = 0;
  for (const UnitGroup& g : units_.at(u).groups) n += g.padded * static_cast<int64_t>(dtype_size(g.dtype));
  return n;
}

void ParamUnits::start_gather(size_t u) {
  Unit& un = units_[u];
  if (un.state != State::Released) return;
  profiler::Range r("gather", "param_units");
  {
    MemoryCategoryGuard cat(MemoryCategory::Gathered);
    for (UnitGroup& g : un.groups) reallocate_storage(g.flat.storage());
  }
  for (size_t gi = 0; gi < un.groups.size(); ++gi) un.waiters.push_back(source_->fetch(u, gi, un.groups[gi].flat));
  un.state = State::Fetching;
  stats_.gathers++;
  stats_.gathered_bytes += unit_bytes(u);
  stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
  if (!un.kept) {
    stats_.gathered_units++;
    stats_.peak_gathered_units = std::max(stats_.peak_gathered_units, stats_.gathered_units);
  }
}

void ParamUnits::gather(size_t u) {
  MG_CHECK(u < units_.size(), IndexError, "ParamUnits: unit ", u, " out of range for ", units_.size(), " units");
  start_gather(u);
  Unit& un = units_[u];
  if (un.state != State::Fetching) return;
  const auto t0 = std::chrono::steady_clock::now();
  {
    profiler::Range r("gather wait", "param_units");  // what the prefetch left exposed
    drain(un);
  }
  un.state = State::Ready;
  stats_.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void ParamUnits::drain(Unit& un) {
  std::vector<std::function<void()>> waiters = std::move(un.waiters);
  un.waiters.clear();
  for (auto& w : waiters) w();
}

void ParamUnits::release(size_t u) {
  Unit& un = units_[u];
  if (un.state == State::Released) return;
  if (un.state == State::Fetching) drain(un);  // the fetch writes into the storage: let it land first
  for (UnitGroup& g : un.groups) release_storage(g.flat.storage());
  un.state = State::Released;
  stats_.gathered_bytes -= unit_bytes(u);
  if (!un.kept) stats_.gathered_units--;
}

void ParamUnits::prefetch_after(size_t u, int direction) {
  if (opts_.prefetch == 0) return;
  std::vector<size_t> order = order_;
  if (order.empty())
    for (size_t i = 0; i < units_.size(); ++i) order.push_back(i);
  auto it = std::find(order.begin(), order.end(), u);
  if (it == order.end()) return;
  auto pos = static_cast<int64_t>(it - order.begin());
  for (int d = 1; d <= opts_.prefetch; ++d) {
    const int64_t j = pos + direction * d;
    if (j < 0 || j >= static_cast<int64_t>(order.size())) break;
    // In backward, a unit whose gradients are all in is done: nothing to fetch for it.
    start_gather(order[static_cast<size_t>(j)]);
  }
}

void ParamUnits::enter(size_t u) {
  MG_CHECK(u < units_.size(), IndexError, "ParamUnits::enter: unit ", u, " out of range for ", units_.size(), " units");
  const bool backward = autograd::in_backward();
  if (!backward) {
    if (!in_step_) {
      release_all();  // after an optimizer step every unit is fetched fresh
      in_step_ = true;
      callback_queued_ = false;
      current_order_.clear();
      source_->begin_step();
    }
    if (std::find(current_order_.begin(), current_order_.end(), u) == current_order_.end()) current_order_.push_back(u);
  }
  gather(u);
  if (!backward) prefetch_after(u, +1);
}

std::vector<Tensor> ParamUnits::leave(size_t u, const std::vector<Tensor>& outputs) {
  MG_CHECK(u < units_.size(), IndexError, "ParamUnits::leave: unit ", u, " out of range for ", units_.size(), " units");
  if (autograd::in_backward()) return outputs;
  std::vector<Tensor> out = outputs;
  if (autograd::any_requires_grad(outputs)) {
    std::vector<Tensor> ins, aliases;
    std::vector<size_t> where;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].defined()) {
        ins.push_back(outputs[i]);
        aliases.push_back(outputs[i].detach());
        where.push_back(i);
      }
    autograd::record("unit_boundary", ins, aliases, [this, u](const std::vector<Tensor>& g) {
      pre_backward(u);
      return g;
    });
    for (size_t k = 0; k < where.size(); ++k) out[where[k]] = aliases[k];
  }
  if (!units_[u].kept) release(u);
  return out;
}

Tensor ParamUnits::run(size_t u, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  enter(u);
  return leave(u, {fn(x)})[0];
}

void ParamUnits::ensure_callback() {
  if (callback_queued_ || !autograd::in_backward()) return;
  autograd::queue_callback([this] { end_backward(); });
  callback_queued_ = true;
}

void ParamUnits::pre_backward(size_t u) {
  ensure_callback();
  if (!current_order_.empty()) order_ = current_order_;
  gather(u);
  prefetch_after(u, -1);
}

void ParamUnits::on_gradient(size_t u, size_t gi, size_t k, const Tensor& grad) {
  ensure_callback();
  Unit& un = units_[u];
  UnitGroup& g = un.groups[gi];
  size_t idx = k;
  for (size_t j = 0; j < gi; ++j) idx += un.groups[j].params.size();
  Tensor& buf = un.grads[gi];
  if (!buf.defined()) {
    MemoryCategoryGuard cat(MemoryCategory::Gradients);
    buf = empty({g.padded}, TensorOptions(g.master_dtype, opts_.device));
  }
  Tensor slot = raw::view(raw::slice(buf, 0, g.offsets[k], g.offsets[k] + g.params[k].numel(), 1), grad.sizes());
  if (un.got[idx]) {  // a second gradient in one backward (a parameter read in two checkpoint regions)
    raw::copy_(slot, kernels::add(slot, grad));
    return;
  }
  raw::copy_(slot, grad);
  un.got[idx] = 1;
  if (++un.arrived == un.trainable) finish_unit(u);
}

void ParamUnits::finish_unit(size_t u) {
  Unit& un = units_[u];
  size_t idx = 0;
  for (size_t gi = 0; gi < un.groups.size(); ++gi) {
    UnitGroup& g = un.groups[gi];
    Tensor buf = std::move(un.grads[gi]);
    un.grads[gi] = Tensor();
    if (!buf.defined()) {
      idx += g.params.size();
      continue;
    }
    for (size_t k = 0; k < g.params.size(); ++k, ++idx)  // zero where no gradient came
      if (!un.got[idx]) raw::fill_(raw::slice(buf, 0, g.offsets[k], g.offsets[k] + g.params[k].numel(), 1), 0.0);
    if (g.padded > g.numel) raw::fill_(raw::slice(buf, 0, g.numel, g.padded, 1), 0.0);
    source_->reduce(u, gi, std::move(buf));
  }
  std::fill(un.got.begin(), un.got.end(), 0);
  un.arrived = 0;
  stats_.reductions++;
  if (!un.kept) release(u);
}

void ParamUnits::end_backward() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].arrived > 0) finish_unit(u);
  release_all();
  source_->end_backward();
  in_step_ = false;
  callback_queued_ = false;
}

void ParamUnits::abandon_step() {
  for (Unit& un : units_) {
    for (Tensor& g : un.grads) g = Tensor();
    std::fill(un.got.begin(), un.got.end(), 0);
    un.arrived = 0;
  }
  release_all();
  source_->abandon_step();
  in_step_ = false;
  callback_queued_ = false;
}

void ParamUnits::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

void ParamUnits::with_all_gathered(const std::function<void()>& fn) {
  std::vector<size_t> gathered_here;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].state == State::Released) gathered_here.push_back(u);
    gather(u);
  }
  struct Release {
    ParamUnits* self;
    const std::vector<size_t>& us;
    ~Release() {
      for (size_t u : us) self->release(u);
    }
  } release{this, gathered_here};
  fn();
}

void ParamUnits::reset_peaks() {
  stats_.peak_gathered_units = stats_.gathered_units;
  stats_.peak_gathered_bytes = stats_.gathered_bytes;
}

}  // namespace mg
