// Module: the PyTorch-style building block. It owns named parameters, buffers and child
// modules, walks them recursively (parameters(), train(), to()) and runs forward().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg {
struct StateDict;  // core/state_dict.h (kept out of this header: it pulls in the JSON library)
}

namespace mg::nn {

// What load_state_dict found: own keys the dict lacks, dict keys the module lacks.
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

// A Parameter is a leaf Tensor that requires grad. Returns `t` itself when it already is
// one (so the identity is kept), otherwise a detached alias of it with requires_grad set.
Tensor parameter(Tensor t);

// core/tensor.h's retarget: what Module::to does per tensor.
using mg::retarget;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The base class raises mg::ValueError (containers and losses that
  // take other arguments define their own call operators).
  virtual Tensor forward(const Tensor& x);
  // Runs the forward pre-hooks, then forward().
  Tensor operator()(const Tensor& x) {
    run_forward_pre_hooks();
    return forward(x);
  }

  // Forward pre-hooks run, in registration order, before each call through operator()
  // (pruning recomputes weight = weight_orig * weight_mask there). A key names the hook;
  // registering an existing key replaces it. remove returns whether the key was present.
  using ForwardPreHook = std::function<void(Module&)>;
  void register_forward_pre_hook(const std::string& key, ForwardPreHook hook);
  bool remove_forward_pre_hook(const std::string& key);
  bool has_forward_pre_hook(const std::string& key) const;
  // Runs them: operator() does, and so does a parent module that calls a fused op on its
  // children's parameters instead of calling the children (nn/transformer.cc).
  void run_forward_pre_hooks();

  // Registration. The returned reference is the registry's slot: assigning to it (for
  // example `b.weight = a.weight` through a member bound to the slot) re-points the
  // registered parameter, which is how weights are shared. Registering an existing name
  // replaces that entry. An undefined tensor registers an absent parameter (bias=false).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    register_module_impl(name, m);
    return m;
  }

  // Recursive walks with dotted names ("0.weight", "encoder.1.bias"). Each distinct tensor
  // (by identity) is listed once, under the first name it is reached by.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // This module (name "") and every descendant, pre-order, each distinct module once.
  std::vector<std::pair<std::string, Module*>> named_modules() const;

  // Looks up a direct parameter / buffer / child by name; raises mg::ValueError naming the choices.
  Tensor& param(const std::string& name);
  Tensor& buffer(const std::string& name);
  std::shared_ptr<Module> child(const std::string& name) const;

  // The layout this module's convolutions (and its descendants') run in. ChannelsLast: each
  // Conv2d turns a CUDA input NHWC (a no-op once it is), so after the first convolution the
  // network runs channels-last end to end: convolutions, batch norm, pooling, activations and
  // residual adds keep NHWC with no transposes (docs/layouts.md). Parameters keep their NCHW
  // shape and layout, so checkpoints and optimizers see no difference.
  void set_memory_format(MemoryFormat fmt);
  // What set_memory_format calls on each module; layers with a layout choice override it.
  virtual void on_memory_format(MemoryFormat) {}

  // Training mode (dropout, batch norm) for this module and all descendants.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops (set_to_none) or zero-fills every parameter's .grad.
  void zero_grad(bool set_to_none = true);

  // Sets requires_grad on every parameter of this module and its descendants. Freezing a
  // sub-module (a pretrained backbone) with requires_grad_(false) takes it off the tape: its
  // ops record no nodes and save no activations, its parameters get no .grad, so an
  // optimizer never creates state for them.
  Module& requires_grad_(bool on = true);

  // Moves / casts every parameter and buffer in place: each keeps its identity (the same
  // TensorImpl now points at new storage), so handles held elsewhere, including the
  // optimizer's, stay valid. Gradients move with their parameters. to(DType) casts only
  // floating tensors, like PyTorch.
  Module& to(Device device);
  Module& to(DType dtype);

  // A derived parameter's slot holds a tensor computed from others (pruning: weight =
  // weight_orig * weight_mask, refreshed each forward). Walks (named_parameters, to,
  // zero_grad, state_dict) skip it; param(name) and members bound to the slot still see it.
  void set_parameter_derived(const std::string& name, bool derived);
  bool is_parameter_derived(const std::string& name) const;
  // Drops a direct parameter or buffer. Only for entries no member is bound to (a bound
  // member would dangle): pruning's weight_orig / weight_mask.
  void unregister(const std::string& name);

  // Every parameter and buffer (each distinct tensor once, under named_parameters' /
  // named_buffers' names), detached and sharing storage with the module.
  StateDict state_dict() const;
  // Copies matching entries in (converting dtype and device; tensors keep their identity).
  // A shape mismatch is a ShapeError whatever `strict`; with strict, missing or unexpected
  // keys are a ValueError listing them. Everything is checked before anything is copied.
  LoadStateDictResult load_state_dict(const StateDict& dict, bool strict = true);
  // The checking half: validates `dict`, converts each entry to its destination's dtype and
  // device (every allocation happens here), fills `result` if given, and returns the commit
  // (core/state_dict.h's StagedLoad), which only copies into the module's tensors.
  std::function<void()> stage_state_dict(const StateDict& dict, bool strict = true,
                                         LoadStateDictResult* result = nullptr);

  // Number of scalars in parameters() (shared parameters counted once).
  int64_t num_parameters(bool only_trainable = false) const;

  const std::string& type_name() const { return type_name_; }
  // One-line description of this module's own configuration ("in=784, out=256").
  virtual std::string extra_repr() const { return ""; }
  // PyTorch-like tree printout.
  std::string str() const;

 private:
  struct Slot {
    std::string name;
    Tensor value;
    bool derived = false;
  };
  Tensor& find_slot(std::vector<std::unique_ptr<Slot>>& slots, const std::string& name, const char* kind);
  static Tensor& set_slot(std::vector<std::unique_ptr<Slot>>& slots, const std::string& name, Tensor t);
  void check_new_name(const std::string& name, const char* what) const;
  void register_module_impl(const std::string& name, std::shared_ptr<Module> m);
  template <class F>
  void walk(const std::string& prefix, bool recurse, F&& f) const;
  void print(std::ostream& os, int indent) const;

  std::string type_name_;
  bool training_ = true;
  // unique_ptr keeps each slot's address stable as more are added (members bind to them).
  std::vector<std::unique_ptr<Slot>> params_;
  std::vector<std::unique_ptr<Slot>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<std::string, ForwardPreHook>> pre_hooks_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace mg::nn
