// nn::Sequential: runs its children in order; they are registered as "0", "1", ...
// so parameter names read like PyTorch's ("0.weight", "2.bias").
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "nn/module.h"

namespace mg::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Appends and registers under the next index; returns *this for chaining.
  Sequential& push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  bool empty() const { return layers_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace mg::nn
