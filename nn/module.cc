#include "nn/module.h"

#include <sstream>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "core/state_dict.h"
#include "kernels/ops.h"

namespace mg::nn {

Tensor parameter(Tensor t) {
  MG_CHECK(t.defined(), ValueError, "parameter: undefined tensor");
  MG_CHECK(is_floating(t.dtype()), DTypeError, "parameter: only floating tensors can be parameters, got ", t.dtype());
  if (t.is_leaf() && t.requires_grad()) return t;
  Tensor p = t.is_leaf() ? t : t.detach();
  p.requires_grad_(true);
  return p;
}

Tensor Module::forward(const Tensor&) {
  MG_THROW(ValueError, type_name_, "::forward: this module does not define forward(const Tensor&)");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  MG_CHECK(!name.empty(), ValueError, type_name_, ": ", what, " name must not be empty");
  MG_CHECK(name.find('.') == std::string::npos, ValueError, type_name_, ": ", what, " name \"", name,
           "\" must not contain '.'");
  auto clash = [&](const char* kind) {
    MG_THROW(ValueError, type_name_, ": cannot register ", what, " \"", name, "\": a ", kind,
             " with that name already exists");
  };
  if (std::string(what) != "parameter")
    for (auto& s : params_)
      if (s->name == name) clash("parameter");
  if (std::string(what) != "buffer")
    for (auto& s : buffers_)
      if (s->name == name) clash("buffer");
  if (std::string(what) != "module")
    for (auto& c : children_)
      if (c.first == name) clash("module");
}

// The slot named `name` (re-registering replaces its value), or a new one at the end.
Tensor& Module::set_slot(std::vector<std::unique_ptr<Slot>>& slots, const std::string& name, Tensor t) {
  for (auto& s : slots)
    if (s->name == name) {
      s->value = std::move(t);
      return s->value;
    }
  slots.push_back(std::make_unique<Slot>(Slot{name, std::move(t)}));
  return slots.back()->value;
}

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  if (t.defined()) {
    if (requires_grad) {
      t = parameter(std::move(t));
    } else {
      MG_CHECK(t.is_leaf(), ValueError, type_name_, ": parameter \"", name,
               "\" must be a leaf tensor (detach() it first)");
    }
  }
  return set_slot(params_, name, std::move(t));
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "buffer");
  return set_slot(buffers_, name, std::move(t));
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> m) {
  MG_CHECK(m != nullptr, ValueError, type_name_, ": register_module(\"", name, "\") got a null module");
  MG_CHECK(m.get() != this, ValueError, type_name_, ": a module cannot be its own child (\"", name, "\")");
  check_new_name(name, "module");
  for (auto& c : children_)
    if (c.first == name) {
      c.second = std::move(m);
      return;
    }
  children_.emplace_back(name, std::move(m));
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  std::unordered_set<const Module*> seen;
  std::vector<std::pair<std::string, const Module*>> stack{{"", this}};
  // Pre-order, children in registration order.
  while (!stack.empty()) {
    auto [prefix, m] = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    out.emplace_back(prefix, const_cast<Module*>(m));
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(prefix.empty() ? it->first : prefix + "." + it->first, it->second.get());
  }
  return out;
}

template <class F>
void Module::walk(const std::string& prefix, bool recurse, F&& f) const {
  if (!recurse) {
    f(prefix, this);
    return;
  }
  for (auto& [name, m] : named_modules()) f(name, m);
}

void Module::set_memory_format(MemoryFormat fmt) {
  for (auto& [name, m] : named_modules()) m->on_memory_format(fmt);
}

namespace {
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  walk("", recurse, [&](const std::string& prefix, const Module* m) {
    for (auto& s : m->params_)
      if (!s->derived && s->value.defined() && seen.insert(s->value.impl()).second)
        out.emplace_back(join(prefix, s->name), s->value);
  });
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  walk("", recurse, [&](const std::string& prefix, const Module* m) {
    for (auto& s : m->buffers_)
      if (s->value.defined() && seen.insert(s->value.impl()).second) out.emplace_back(join(prefix, s->name), s->value);
  });
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& c : children_) out.push_back(c.second);
  return out;
}

Tensor& Module::find_slot(std::vector<std::unique_ptr<Slot>>& slots, const std::string& name, const char* kind) {
  std::string names;
  for (auto& s : slots) {
    if (s->name == name) return s->value;
    names += (names.empty() ? "" : ", ") + s->name;
  }
  MG_THROW(ValueError, type_name_, ": no ", kind, " named \"", name, "\" (has: ", names.empty() ? "none" : names, ")");
}

Tensor& Module::param(const std::string& name) { return find_slot(params_, name, "parameter"); }

Tensor& Module::buffer(const std::string& name) { return find_slot(buffers_, name, "buffer"); }

void Module::set_parameter_derived(const std::string& name, bool derived) {
  for (auto& s : params_)
    if (s->name == name) {
      s->derived = derived;
      return;
    }
  param(name);  // throws, naming the parameters there are
}

bool Module::is_parameter_derived(const std::string& name) const {
  for (auto& s : params_)
    if (s->name == name) return s->derived;
  return false;
}

void Module::unregister(const std::string& name) {
  for (auto* slots : {&params_, &buffers_})
    for (auto it = slots->begin(); it != slots->end(); ++it)
      if ((*it)->name == name) {
        slots->erase(it);
        return;
      }
  MG_THROW(ValueError, type_name_, "::unregister: no parameter or buffer named \"", name, "\"");
}

void Module::register_forward_pre_hook(const std::string& key, ForwardPreHook hook) {
  MG_CHECK(hook != nullptr, ValueError, type_name_, "::register_forward_pre_hook(\"", key, "\"): empty hook");
  for (auto& [k, h] : pre_hooks_)
    if (k == key) {
      h = std::move(hook);
      return;
    }
  pre_hooks_.emplace_back(key, std::move(hook));
}

bool Module::remove_forward_pre_hook(const std::string& key) {
  for (auto it = pre_hooks_.begin(); it != pre_hooks_.end(); ++it)
    if (it->first == key) {
      pre_hooks_.erase(it);
      return true;
    }
  return false;
}

bool Module::has_forward_pre_hook(const std::string& key) const {
  for (auto& [k, h] : pre_hooks_)
    if (k == key) return true;
  return false;
}

void Module::run_forward_pre_hooks() {
  // By index: a hook may register or remove hooks.
  for (size_t i = 0; i < pre_hooks_.size(); ++i) {
    ForwardPreHook h = pre_hooks_[i].second;
    h(*this);
  }
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, t] : named_parameters()) out.tensors[name] = t.detach();
  for (auto& [name, t] : named_buffers()) out.tensors[name] = t.detach();
  return out;
}

LoadStateDictResult Module::load_state_dict(const StateDict& dict, bool strict) {
  LoadStateDictResult result;
  stage_state_dict(dict, strict, &result)();
  return result;
}

StagedLoad Module::stage_state_dict(const StateDict& dict, bool strict, LoadStateDictResult* out) {
  auto own = named_parameters();
  for (auto& b : named_buffers()) own.push_back(b);
  LoadStateDictResult result;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  std::string mismatches;
  std::unordered_set<std::string> own_names;
  for (auto& [name, t] : own) {
    own_names.insert(name);
    auto it = dict.tensors.find(name);
    if (it == dict.tensors.end()) {
      result.missing_keys.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    if (!src.defined() || src.sizes() != t.sizes()) {
      mismatches += "\n  " + name + ": checkpoint has " +
                    (src.defined() ? shape_str(src.sizes()) : "an undefined tensor") + ", model has " +
                    shape_str(t.sizes());
      continue;
    }
    copies.emplace_back(t, src);
  }
  for (auto& [name, t] : dict.tensors)
    if (!own_names.count(name)) result.unexpected_keys.push_back(name);
  MG_CHECK(mismatches.empty(), ShapeError, type_name_, "::load_state_dict: size mismatch for", mismatches);
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (auto& k : v) s += (s.empty() ? "" : ", ") + ("\"" + k + "\"");
      return s.empty() ? std::string("none") : s;
    };
    MG_THROW(ValueError, type_name_, "::load_state_dict (strict): missing keys: ", list(result.missing_keys),
             "; unexpected keys: ", list(result.unexpected_keys));
  }
  // Conversions happen now, so the commit is plain same-dtype, same-device copies.
  for (auto& [dst, src] : copies)
    if (src.dtype() != dst.dtype() || src.device() != dst.device()) {
      Tensor staged = empty(dst.sizes(), {dst.dtype(), dst.device()});
      raw::copy_(staged, src);
      src = staged;
    }
  if (out) *out = std::move(result);
  return [copies = std::move(copies)] {
    NoGradGuard ng;
    for (auto& [dst, src] : copies) {
      raw::copy_(dst, src);
      dst.bump_version();
    }
  };
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  std::string names;
  for (auto& c : children_) {
    if (c.first == name) return c.second;
    names += (names.empty() ? "" : ", ") + c.first;
  }
  MG_THROW(ValueError, type_name_, ": no child module named \"", name, "\" (has: ", names.empty() ? "none" : names,
           ")");
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

void Module::zero_grad(bool set_to_none) { zero_grads(parameters(), set_to_none); }

Module& Module::requires_grad_(bool on) {
  for (Tensor& p : parameters()) p.requires_grad_(on);
  return *this;
}


namespace {

template <class Convert>
void convert_in_place(const Tensor& t, Convert&& convert) {
  Tensor moved;
  {
    // The copy is the same kind of memory as the original (parameters stay parameters).
    MemoryCategoryGuard g(t.storage()->category);
    moved = convert(t);
  }
  Tensor grad = t.grad();
  Tensor moved_grad;
  if (grad.defined()) {
    MemoryCategoryGuard g(grad.storage()->category);
    moved_grad = convert(grad);
  }
  retarget(t, moved);
  if (grad.defined()) retarget(grad, moved_grad);
}

std::vector<Tensor> distinct(std::vector<Tensor> a, const std::vector<Tensor>& b) {
  std::unordered_set<const TensorImpl*> seen;
  for (auto& t : a) seen.insert(t.impl());
  for (auto& t : b)
    if (seen.insert(t.impl()).second) a.push_back(t);
  return a;
}
}  // namespace

Module& Module::to(Device device) {
  NoGradGuard ng;
  for (const Tensor& t : distinct(parameters(), buffers())) {
    if (t.device() == device) continue;
    convert_in_place(t, [&](const Tensor& x) { return raw::contiguous(raw::to_device(x, device)); });
  }
  return *this;
}

Module& Module::to(DType dtype) {
  MG_CHECK(is_floating(dtype), DTypeError, type_name_, "::to: can only cast modules to a floating dtype, got ", dtype);
  NoGradGuard ng;
  for (const Tensor& t : distinct(parameters(), buffers())) {
    if (!is_floating(t.dtype()) || t.dtype() == dtype) continue;
    convert_in_place(t, [&](const Tensor& x) { return raw::to_dtype(x, dtype); });
  }
  return *this;
}

int64_t Module::num_parameters(bool only_trainable) const {
  int64_t n = 0;
  for (auto& p : parameters())
    if (!only_trainable || p.requires_grad()) n += p.numel();
  return n;
}

void Module::print(std::ostream& os, int indent) const {
  os << type_name_ << "(" << extra_repr();
  if (children_.empty()) {
    os << ")";
    return;
  }
  os << "\n";
  for (auto& [name, c] : children_) {
    os << std::string(indent + 2, ' ') << "(" << name << "): ";
    c->print(os, indent + 2);
    os << "\n";
  }
  os << std::string(indent, ' ') << ")";
}

std::string Module::str() const {
  std::ostringstream os;
  print(os, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

}  // namespace mg::nn
