#include "nn/prune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace mg::nn::prune {

Amount Amount::fraction(double f) {
  MG_CHECK(std::isfinite(f) && f >= 0.0 && f <= 1.0, ValueError,
           "prune::Amount::fraction: amount must be in [0, 1], got ", f);
  return Amount(true, f, 0);
}

Amount Amount::count(int64_t n) {
  MG_CHECK(n >= 0, ValueError, "prune::Amount::count: amount must be >= 0, got ", n);
  return Amount(false, 0.0, n);
}

int64_t Amount::resolve(int64_t remaining, const std::string& op) const {
  // Python's round(): half to even, which nearbyint gives in the default rounding mode.
  const int64_t k =
      is_fraction_ ? static_cast<int64_t>(std::nearbyint(fraction_ * static_cast<double>(remaining))) : count_;
  MG_CHECK(k <= remaining, ValueError, op, ": amount=", str(), " asks to prune ", k, " entries but only ", remaining,
           " are left unpruned");
  return k;
}

std::string Amount::str() const {
  std::ostringstream os;
  if (is_fraction_)
    os << "fraction(" << fraction_ << ")";
  else
    os << "count(" << count_ << ")";
  return os.str();
}

namespace {

std::string orig_name(const std::string& name) { return name + "_orig"; }
std::string mask_name(const std::string& name) { return name + "_mask"; }
std::string hook_key(const std::string& name) { return "prune." + name; }

bool has_param(const Module& m, const std::string& name) {
  for (auto& [n, t] : m.named_parameters(false))
    if (n == name) return true;
  return false;
}
bool has_buffer(const Module& m, const std::string& name) {
  for (auto& [n, t] : m.named_buffers(false))
    if (n == name) return true;
  return false;
}

// name = name_orig * name_mask, under the caller's grad mode (so backward masks the gradient).
void recompute(Module& m, const std::string& name) {
  m.param(name) = mg::mul(m.param(orig_name(name)), m.buffer(mask_name(name)));
}

// The tensor pruning ranks (the trained values) and the current mask (all ones if unpruned).
struct Target {
  Module* module;
  std::string name;
  Tensor values;
  std::vector<double> mask;
};

Target target(Module& m, const std::string& name, const std::string& op) {
  MG_CHECK(!name.empty(), ValueError, op, ": empty parameter name");
  Target t{&m, name, {}, {}};
  if (is_pruned(m, name)) {
    t.values = m.param(orig_name(name));
    t.mask = m.buffer(mask_name(name)).to_vector<double>();
  } else {
    t.values = m.param(name);  // ValueError naming the module's parameters when absent
    MG_CHECK(t.values.defined(), ValueError, op, ": parameter \"", name, "\" of ", m.type_name(),
             " is absent (undefined)");
    MG_CHECK(is_floating(t.values.dtype()), DTypeError, op, ": parameter \"", name, "\" has dtype ", t.values.dtype(),
             "; only floating parameters can be pruned");
    t.mask.assign(static_cast<size_t>(t.values.numel()), 1.0);
  }
  return t;
}

// Installs (first time) or updates the mask of t and recomputes the derived parameter.
void install_mask(const Target& t, const std::vector<double>& mask) {
  Module& m = *t.module;
  const Tensor& orig = t.values;
  Tensor mask_t;
  {
    MemoryCategoryGuard g(orig.storage()->category);
    mask_t = from_vector(mask, orig.sizes(), {orig.dtype(), orig.device()});
  }
  if (is_pruned(m, t.name)) {
    Tensor& buf = m.buffer(mask_name(t.name));
    NoGradGuard ng;
    raw::copy_(buf, mask_t);
    buf.bump_version();
  } else {
    // The same leaf moves to name_orig: an optimizer that holds it keeps updating it.
    m.register_parameter(orig_name(t.name), orig, orig.requires_grad());
    m.register_buffer(mask_name(t.name), mask_t);
    m.set_parameter_derived(t.name, true);
    const std::string name = t.name;
    m.register_forward_pre_hook(hook_key(name), [name](Module& mod) { recompute(mod, name); });
  }
  recompute(m, t.name);
}

// Zeroes, in `mask`, `k` of the still-kept entries: those that rank first under `score`
// (lower score first, ties by flat index so the result is deterministic).
void prune_lowest(std::vector<double>& mask, const std::vector<double>& score, const std::vector<int64_t>& kept,
                  int64_t k) {
  if (k == 0) return;
  std::vector<int64_t> order(kept);
  auto key = [&](int64_t i) { return std::isnan(score[i]) ? INFINITY : score[i]; };  // NaN: pruned last
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), [&](int64_t a, int64_t b) {
    const double ka = key(a), kb = key(b);
    return ka < kb || (ka == kb && a < b);
  });
  for (int64_t j = 0; j < k; ++j) mask[order[j]] = 0.0;
}

// Computes the new combined mask over the concatenation of `targets`.
void prune_targets(std::vector<Target>& targets, Method method, Amount amount, Generator* gen, const std::string& op) {
  std::vector<double> mask, score;
  for (auto& t : targets) {
    mask.insert(mask.end(), t.mask.begin(), t.mask.end());
    if (method == Method::L1Unstructured) {
      std::vector<double> v = t.values.to_vector<double>();
      for (double& x : v) x = std::fabs(x);
      score.insert(score.end(), v.begin(), v.end());
    }
  }
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < static_cast<int64_t>(mask.size()); ++i)
    if (mask[i] != 0.0) kept.push_back(i);
  const int64_t k = amount.resolve(static_cast<int64_t>(kept.size()), op);
  if (method == Method::RandomUnstructured) {
    // The k largest of uniform draws, like PyTorch (rand_like + topk): negate to rank lowest-first.
    score.assign(mask.size(), 0.0);
    if (!kept.empty()) {
      std::vector<double> r = rand({static_cast<int64_t>(kept.size())}, {DType::f64}, gen).to_vector<double>();
      for (size_t j = 0; j < kept.size(); ++j) score[kept[j]] = -r[j];
    }
  }
  prune_lowest(mask, score, kept, k);
  size_t at = 0;
  for (auto& t : targets) {
    std::vector<double> part(mask.begin() + at, mask.begin() + at + t.mask.size());
    at += t.mask.size();
    install_mask(t, part);
  }
}

void prune_one(Module& m, const std::string& name, Method method, Amount amount, Generator* gen,
               const std::string& op) {
  std::vector<Target> targets{target(m, name, op)};
  prune_targets(targets, method, amount, gen, op);
}

}  // namespace

bool is_pruned(const Module& module, const std::string& name) {
  return has_param(module, orig_name(name)) && has_buffer(module, mask_name(name));
}

void l1_unstructured(Module& module, const std::string& name, Amount amount) {
  prune_one(module, name, Method::L1Unstructured, amount, nullptr, "prune::l1_unstructured(" + name + ")");
}

void random_unstructured(Module& module, const std::string& name, Amount amount, Generator* gen) {
  prune_one(module, name, Method::RandomUnstructured, amount, gen, "prune::random_unstructured(" + name + ")");
}

void global_unstructured(const std::vector<std::pair<Module*, std::string>>& params, Method method, Amount amount,
                         Generator* gen) {
  const std::string op = "prune::global_unstructured";
  MG_CHECK(!params.empty(), ValueError, op, ": no parameters given");
  std::vector<Target> targets;
  for (auto& [m, name] : params) {
    MG_CHECK(m != nullptr, ValueError, op, ": null module for parameter \"", name, "\"");
    for (auto& t : targets)
      MG_CHECK(!(t.module == m && t.name == name), ValueError, op, ": parameter \"", name, "\" of ", m->type_name(),
               " is listed twice");
    targets.push_back(target(*m, name, op));
  }
  prune_targets(targets, method, amount, gen, op);
}

void custom_from_mask(Module& module, const std::string& name, const Tensor& mask) {
  const std::string op = "prune::custom_from_mask(" + name + ")";
  Target t = target(module, name, op);
  MG_CHECK(mask.defined() && mask.sizes() == t.values.sizes(), ShapeError, op, ": mask shape ",
           mask.defined() ? shape_str(mask.sizes()) : std::string("(undefined)"), " does not match parameter shape ",
           shape_str(t.values.sizes()));
  std::vector<double> m = mask.to_vector<double>();
  for (size_t i = 0; i < m.size(); ++i) m[i] = (m[i] != 0.0 && t.mask[i] != 0.0) ? 1.0 : 0.0;
  install_mask(t, m);
}

void remove(Module& module, const std::string& name) {
  MG_CHECK(is_pruned(module, name), ValueError, "prune::remove: parameter \"", name, "\" of ", module.type_name(),
           " is not pruned (no ", orig_name(name), " / ", mask_name(name), ")");
  Tensor orig = module.param(orig_name(name));
  {
    NoGradGuard ng;
    Tensor w = mg::mul(orig, module.buffer(mask_name(name)));
    raw::copy_(orig, w);
    orig.bump_version();
  }
  module.remove_forward_pre_hook(hook_key(name));
  module.unregister(orig_name(name));
  module.unregister(mask_name(name));
  module.set_parameter_derived(name, false);
  module.param(name) = orig;
}

double sparsity(const Tensor& t) {
  MG_CHECK(t.defined(), ValueError, "prune::sparsity: undefined tensor");
  if (t.numel() == 0) return 0.0;
  std::vector<double> v = t.to_vector<double>();
  return static_cast<double>(std::count(v.begin(), v.end(), 0.0)) / static_cast<double>(v.size());
}

SparsityReport sparsity(const Module& module) {
  SparsityReport r;
  for (auto& [prefix, m] : module.named_modules()) {
    for (auto& [pname, p] : m->named_parameters(false)) {
      std::string name = pname;
      std::vector<double> v = p.to_vector<double>();
      const std::string suffix = "_orig";
      if (pname.size() > suffix.size() && pname.compare(pname.size() - suffix.size(), suffix.size(), suffix) == 0) {
        const std::string base = pname.substr(0, pname.size() - suffix.size());
        if (is_pruned(*m, base)) {
          name = base;
          std::vector<double> mask = m->buffer(mask_name(base)).to_vector<double>();
          for (size_t i = 0; i < v.size(); ++i) v[i] *= mask[i];
        }
      }
      SparsityEntry e{prefix.empty() ? name : prefix + "." + name, static_cast<int64_t>(v.size()),
                      static_cast<int64_t>(std::count(v.begin(), v.end(), 0.0))};
      r.numel += e.numel;
      r.zeros += e.zeros;
      r.entries.push_back(std::move(e));
    }
  }
  return r;
}

std::string SparsityReport::str() const {
  std::ostringstream os;
  char line[256];
  for (auto& e : entries) {
    std::snprintf(line, sizeof line, "%-32s zeros %10lld / %10lld (%6.2f%%)\n", e.name.c_str(),
                  static_cast<long long>(e.zeros), static_cast<long long>(e.numel), 100.0 * e.sparsity());
    os << line;
  }
  std::snprintf(line, sizeof line, "%-32s zeros %10lld / %10lld (%6.2f%%)\n", "total", static_cast<long long>(zeros),
                static_cast<long long>(numel), 100.0 * sparsity());
  os << line;
  return os.str();
}

}  // namespace mg::nn::prune
