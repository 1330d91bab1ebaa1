#include "autograd/autocast_policy.h"

#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/device_runtime.h"
#include "kernels/amp.h"
#include "kernels/ops.h"
#include "kernels/optim.h"

namespace mg::autocast {

namespace {

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

// The device type autocast is consulted for: the first defined input's.
const Tensor* first_defined(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t && t->defined()) return t;
  return nullptr;
}

// Eligible for a cast to the low dtype: f32, or the other half type (PyTorch's rule: f64
// is left alone so explicit double-precision code keeps working).
bool lowerable(const Tensor& t, DType target) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::f64 && t.dtype() != target;
}

// The weight-cast cache. Keyed by the weight's TensorImpl; an entry is valid while the
// weight is alive (weak_ptr), unmodified (version), cast to the same dtype, under the same
// grad mode (a cast made under no_grad has no history to reuse under grad), and while its
// cast node has not been released by a backward (gradient accumulation inside one region
// runs backward between forwards; the stale node would refuse a second backward).
struct Entry {
  std::weak_ptr<TensorImpl> source;
  uint32_t version = 0;
  DType dtype = DType::f32;
  bool with_grad = false;
  Tensor cast;
  // Made by prefetch() without its graph edge: the first lookup under grad records it, so the
  // cast node comes right before its first consumer, as a cast made there would (the engine runs
  // later nodes first: edges recorded at the region's start would leave every weight gradient's
  // cast to the end of backward).
  bool edge_pending = false;
  // Handed over by provide_cast() (made outside any region, by an optimizer's kernel).
  bool provided = false;
};
struct Cache {
  std::unordered_map<const TensorImpl*, Entry> entries;
  // Each entry's key by its cast (cast_source; an entry replaced since is told by its cast).
  std::unordered_map<const TensorImpl*, const TensorImpl*> by_cast;
  // The weights cast since the last prefetch, in order, with their dtypes (what the next region
  // will cast again), and the region whose first cast made the last prefetch.
  std::vector<std::pair<std::weak_ptr<TensorImpl>, DType>> sources;
  std::unordered_set<const TensorImpl*> source_set;  // sources, to add each once
  uint64_t prefetched_region = 0;
};

thread_local Cache tl_cache;
void put_entry(const TensorImpl* key, Entry e) {
  if (e.cast.defined()) tl_cache.by_cast[e.cast.impl()] = key;
  tl_cache.entries[key] = std::move(e);
}
// A weight a lookup used since the last prefetch: the next region casts it ahead.
void note_source(const Tensor& t, DType dtype) {
  if (tl_cache.source_set.insert(t.impl()).second) tl_cache.sources.emplace_back(t.impl_ptr(), dtype);
}

void clear_cache() {
  tl_cache.entries.clear();
  tl_cache.by_cast.clear();
}

bool cacheable(const Tensor& t) {
  const AutocastState st = autocast_state();
  return t.is_leaf() && t.requires_grad() && t.dtype() == DType::f32 && st.nesting > 0 && st.cache_weight_casts;
}

// A new region (the first cast since an Autocast guard entered): cast every weight the previous
// regions cast, still alive, cacheable and on t's device, to `dtype` in one multi-tensor launch
// instead of one cast kernel each as the ops reach them (GPT-2: 97 launches a step). Under grad
// mode each gets the edge t.to(dtype) would record, at its first use. Only weights a lookup used
// since the last prefetch are cast ahead; one the new region does not use is cast for nothing; the casts live until the
// region exits, as casts made one by one would.
void prefetch(const Tensor& t, DType dtype) {
  const uint64_t region = autocast_region_count();
  if (tl_cache.prefetched_region == region) return;
  tl_cache.prefetched_region = region;
  std::vector<std::pair<std::weak_ptr<TensorImpl>, DType>> previous = std::move(tl_cache.sources);
  tl_cache.sources.clear();
  tl_cache.source_set.clear();
  // A graph being captured would bake in weights it does not own: each cast there is its own op.
  if (t.is_cuda() && cuda::is_capturing(t.device().index)) return;
  std::vector<Tensor> src, dst;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& source : previous) {
    std::shared_ptr<TensorImpl> impl = source.first.lock();
    if (!impl || !seen.insert(impl.get()).second || tl_cache.entries.count(impl.get())) continue;
    Tensor s(std::move(impl));
    if (!cacheable(s) || s.device() != t.device() || !s.is_contiguous()) continue;
    src.push_back(s);
    dst.push_back(empty(s.sizes(), {dtype, s.device()}));
  }
  if (src.size() < 2) return;  // one cast: nothing to batch
  kernels::multi_tensor_cast_(src, dst);
  for (size_t i = 0; i < src.size(); ++i) {
    put_entry(src[i].impl(), Entry{src[i].impl_ptr(), src[i].version(), dtype, false, dst[i], true});
  }
}

// The edge t.to(dtype) would record from t to its cast c.
void record_cast_edge(const Tensor& t, const Tensor& c) {
  autograd::record("to", {t}, c, [from = t.dtype()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{kernels::cast(g[0], from)};
  });
  autograd::accept_source_dtype_grads(c, t.dtype());
}

// Installed while static initializers run: the ops below are linked wherever autocast can
// be entered, so this translation unit (and the hook) always comes along.
[[maybe_unused]] const bool hook_installed = [] {
  detail::autocast_cache_clear_hook = &clear_cache;
  return true;
}();

// A new cast of t, or in a checkpoint replay that kept the forward's casts (keep_ops
// "weight_casts") the kept one, which stands in for it: the same values, with the edge a fresh
// t.to(dtype) would record. A region's forward keeping them keeps this one.
Tensor stashed_or_new_cast(const Tensor& t, DType dtype) {
  Tensor c = autograd::stash_take_cast(t, dtype);
  if (c.defined())
    record_cast_edge(t, c);
  else
    c = t.to(dtype);
  autograd::stash_put_cast(t, c);
  return c;
}
}  // namespace

Tensor cached_cast(const Tensor& t, DType dtype) {
  if (!t.defined() || t.dtype() == dtype) return t;
  const AutocastState st = autocast_state();
  if (st.nesting > 0 && !st.cache_weight_casts && t.is_leaf() && t.requires_grad() && t.dtype() == DType::f32) {
    // A region without the cache: each use casts (a checkpoint region that keeps weight casts
    // still keeps them), and the weights earlier regions cast are not cast ahead of the next
    // region nor written by an optimizer for it (weights_cast_next_region), where they would stay
    // for that region as the cache's entries.
    tl_cache.sources.clear();
    tl_cache.source_set.clear();
    return stashed_or_new_cast(t, dtype);
  }
  if (!cacheable(t)) return t.to(dtype);
  const bool grad = is_grad_enabled();
  prefetch(t, dtype);
  auto it = tl_cache.entries.find(t.impl());
  // A provided cast is eager memory its graph's replays would never write: a capture casts anew.
  if (it != tl_cache.entries.end() && it->second.provided && t.is_cuda() && cuda::is_capturing(t.device().index)) {
    tl_cache.entries.erase(it);
    it = tl_cache.entries.end();
  }
  if (it != tl_cache.entries.end()) {
    Entry& e = it->second;
    if (e.edge_pending && grad && e.source.lock() == t.impl_ptr() && e.version == t.version() && e.dtype == dtype) {
      record_cast_edge(t, e.cast);  // a prefetched cast's first use under grad
      e.edge_pending = false;
      e.with_grad = true;
    }
    const auto fn = autograd::grad_fn(e.cast);
    const bool stale_node = grad && (!fn || fn->released);
    // A cast made under grad serves a lookup under no_grad too (its history is then unused).
    if (e.source.lock() == t.impl_ptr() && e.version == t.version() && e.dtype == dtype &&
        (e.with_grad == grad || e.with_grad) && !stale_node) {
      autograd::stash_put_cast(t, e.cast);  // a checkpoint region keeping weight casts keeps this one
      note_source(t, dtype);
      return e.cast;
    }
  }
  Tensor c = stashed_or_new_cast(t, dtype);
  put_entry(t.impl(), Entry{t.impl_ptr(), t.version(), dtype, grad, c});
  note_source(t, dtype);
  return c;
}

std::vector<std::pair<Tensor, DType>> weights_cast_next_region() {
  std::vector<std::pair<Tensor, DType>> out;
  for (const auto& [w, dtype] : tl_cache.sources)
    if (std::shared_ptr<TensorImpl> impl = w.lock()) out.emplace_back(Tensor(std::move(impl)), dtype);
  return out;
}

void provide_cast(const Tensor& weight, const Tensor& cast) {
  MG_CHECK(weight.defined() && cast.defined(), ValueError, "provide_cast: undefined tensor");
  MG_CHECK(cast.sizes() == weight.sizes() && (cast.device() == weight.device() || !weight.is_cuda()) &&
               is_half(cast.dtype()) && weight.dtype() == DType::f32,
           ValueError, "provide_cast: the cast of an f32 weight of shape ", shape_str(weight.sizes()), " on ",
           weight.device(), " must be f16/bf16 of its shape and device, got ", cast.dtype(), " ",
           shape_str(cast.sizes()), " on ", cast.device());
  Entry e{weight.impl_ptr(), weight.version(), cast.dtype(), false, cast, true};
  e.provided = true;
  put_entry(weight.impl(), std::move(e));
}

Tensor provided_cast(const Tensor& weight) {
  if (!weight.defined()) return Tensor();
  auto it = tl_cache.entries.find(weight.impl());
  if (it == tl_cache.entries.end()) return Tensor();
  const Entry& e = it->second;
  const bool valid = e.provided && e.source.lock() == weight.impl_ptr() && e.version == weight.version();
  return valid ? e.cast : Tensor();
}

size_t cache_size() { return tl_cache.entries.size(); }

Tensor cast_source(const Tensor& t) {
  if (!t.defined()) return Tensor();
  const auto k = tl_cache.by_cast.find(t.impl());
  if (k == tl_cache.by_cast.end()) return Tensor();
  const auto it = tl_cache.entries.find(k->second);
  if (it == tl_cache.entries.end() || it->second.cast.impl() != t.impl()) return Tensor();
  std::shared_ptr<TensorImpl> src = it->second.source.lock();
  return src ? Tensor(std::move(src)) : Tensor();
}

bool is_cached_cast(const Tensor& t) {
  if (!t.defined()) return false;
  for (const auto& [key, e] : tl_cache.entries)
    if (e.cast.defined() && e.cast.storage() == t.storage()) return true;
  return false;
}

bool lower_needed(std::initializer_list<const Tensor*> ts) {
  const Tensor* f = first_defined(ts);
  if (!f) return false;
  const DeviceType dev = f->device().type;
  if (!is_autocast_enabled(dev)) return false;
  const DType target = autocast_dtype(dev);
  for (const Tensor* t : ts)
    if (t && lowerable(*t, target)) return true;
  return false;
}

bool lower_needed(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (t.defined() && is_autocast_enabled(t.device().type) && lowerable(t, autocast_dtype(t.device().type)))
      return true;
  return false;
}

Tensor lower(const Tensor& t) {
  if (!t.defined() || !is_autocast_enabled(t.device().type)) return t;
  const DType target = autocast_dtype(t.device().type);
  if (!lowerable(t, target)) return t;
  return cached_cast(t, target);
}

bool widen_needed(std::initializer_list<const Tensor*> ts) {
  const Tensor* f = first_defined(ts);
  if (!f || !is_autocast_enabled(f->device().type)) return false;
  for (const Tensor* t : ts)
    if (t && t->defined() && is_half(t->dtype())) return true;
  return false;
}

Tensor widen(const Tensor& t) { return t.defined() && is_half(t.dtype()) ? t.to(DType::f32) : t; }

namespace {
struct CastSources {
  std::mutex mu;
  uint64_t next = 1;
  std::vector<std::pair<uint64_t, HostCastSource>> list;
};
CastSources& cast_sources() {
  static CastSources* r = new CastSources();  // leaked: sources may be removed during exit
  return *r;
}
Tensor cast_from_sources(const Tensor& t, const Device& device, DType dtype) {
  std::vector<HostCastSource> fns;
  {
    CastSources& r = cast_sources();
    std::lock_guard<std::mutex> g(r.mu);
    for (const auto& [h, fn] : r.list) fns.push_back(fn);
  }
  NoGradGuard ng;
  for (const HostCastSource& fn : fns)
    if (Tensor c = fn(t, device, dtype); c.defined()) return c;
  return Tensor();
}
}  // namespace

Tensor lower_to(const Tensor& t, const Device& device) {
  if (!t.defined()) return t;
  const DType target = autocast_dtype(device.type);
  // Outside a region (or a dtype autocast leaves alone): the values as they are, on the device.
  if (!is_autocast_enabled(device.type) || !lowerable(t, target)) return t.device() == device ? t : t.to(device);
  const bool grad = is_grad_enabled();
  auto it = tl_cache.entries.find(t.impl());
  if (it != tl_cache.entries.end()) {
    Entry& e = it->second;
    const bool current =
        e.source.lock() == t.impl_ptr() && e.version == t.version() && e.dtype == target && e.cast.device() == device;
    if (current && e.edge_pending && grad) {
      record_cast_edge(t, e.cast);  // a provided cast's first use under grad
      e.edge_pending = false;
      e.with_grad = true;
    }
    const auto fn = autograd::grad_fn(e.cast);
    if (current && (e.with_grad == grad || e.with_grad) && !(grad && (!fn || fn->released))) return e.cast;
  }
  // No cast for this region yet: a host cast source's copy (with the edge a cast records), else
  // the f32 values to the device, cast there (the copy's edge brings the gradient home). Kept for
  // the region's other uses of t.
  Tensor c = cast_from_sources(t, device, target);
  if (c.defined()) {
    if (grad) record_cast_edge(t, c);
  } else {
    c = t.to(device).to(target);
  }
  put_entry(t.impl(), Entry{t.impl_ptr(), t.version(), target, grad, c});
  return c;
}

uint64_t add_host_cast_source(HostCastSource source) {
  MG_CHECK(static_cast<bool>(source), ValueError, "add_host_cast_source: an empty function");
  CastSources& r = cast_sources();
  std::lock_guard<std::mutex> g(r.mu);
  r.list.emplace_back(r.next, std::move(source));
  return r.next++;
}

void remove_host_cast_source(uint64_t handle) {
  CastSources& r = cast_sources();
  std::lock_guard<std::mutex> g(r.mu);
  std::erase_if(r.list, [&](const auto& e) { return e.first == handle; });
}

}  // namespace mg::autocast
