// The autograd state behind core's opaque AutogradMetaInterface: requires_grad, .grad, and
// the grad_fn / leaf accumulator that tie a tensor into the recorded graph.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace mg::autograd {

struct Node;

struct AutogradMeta final : AutogradMetaInterface {
  bool requires_grad_ = false;
  bool retains_grad_ = false;
  // Set on a leaf whose .grad only its owner reads, once, and nobody updates in place (a
  // checkpoint replay's detached inputs): AccumulateGrad keeps the first gradient as it comes,
  // without the defensive copy it makes of a buffer another path might still hold.
  bool private_grad_ = false;
  std::shared_ptr<TensorImpl> grad_;
  std::shared_ptr<Node> grad_fn_;  // null for leaves
  uint32_t output_nr_ = 0;         // which output of grad_fn_ this tensor is
  // Weak: the graph owns a leaf's AccumulateGrad, so it dies with the last graph using it.
  std::weak_ptr<Node> grad_accumulator_;

  bool requires_grad() const override { return requires_grad_; }
  void set_requires_grad(bool on) override { requires_grad_ = on; }
  bool is_leaf() const override { return grad_fn_ == nullptr; }
  void set_retains_grad() override { retains_grad_ = true; }
  const std::shared_ptr<TensorImpl>& grad() const override { return grad_; }
  void set_grad(std::shared_ptr<TensorImpl> g) override { grad_ = std::move(g); }
};

// The tensor's state, or null when it never took part in autograd. A static_cast is enough:
// AutogradMeta is the only implementation (core makes one only through autograd's hooks).
inline AutogradMeta* meta(const TensorImpl& impl) { return static_cast<AutogradMeta*>(impl.autograd.get()); }
inline AutogradMeta* meta(const Tensor& t) { return t.defined() ? meta(*t.impl()) : nullptr; }

// The state, created on first use.
inline AutogradMeta& materialize_meta(const Tensor& t) {
  if (!t.impl()->autograd) t.impl()->autograd = std::make_shared<AutogradMeta>();
  return *meta(t);
}

// The node that produced `t`: null for leaves and for tensors autograd never saw.
inline const std::shared_ptr<Node>& grad_fn(const Tensor& t) {
  static const std::shared_ptr<Node> none;
  const AutogradMeta* m = meta(t);
  return m ? m->grad_fn_ : none;
}

}  // namespace mg::autograd
