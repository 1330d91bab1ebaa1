// Module: the PyTorch-style building block. It owns named parameters, buffers and child
// modules, walks them recursively (parameters(), train(), to()) and runs forward().
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg::nn {

// A Parameter is a leaf Tensor that requires grad. Returns `t` itself when it already is
// one (so the identity is kept), otherwise a detached alias of it with requires_grad set.
Tensor parameter(Tensor t);

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The base class raises mg::ValueError (containers and losses that
  // take other arguments define their own call operators).
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

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

  // Looks up a direct parameter / child by name; raises mg::ValueError naming the choices.
  Tensor& param(const std::string& name);
  std::shared_ptr<Module> child(const std::string& name) const;

  // Training mode (dropout, batch norm) for this module and all descendants.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops (set_to_none) or zero-fills every parameter's .grad.
  void zero_grad(bool set_to_none = true);

  // Moves / casts every parameter and buffer in place: each keeps its identity (the same
  // TensorImpl now points at new storage), so handles held elsewhere, including the
  // optimizer's, stay valid. Gradients move with their parameters. to(DType) casts only
  // floating tensors, like PyTorch.
  Module& to(Device device);
  Module& to(DType dtype);

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
  };
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
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace mg::nn
