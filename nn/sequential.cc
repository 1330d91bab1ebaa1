#include "nn/sequential.h"

#include <string>

namespace mg::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(m);
}

Sequential& Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : layers_) h = (*m)(h);  // through operator(): forward pre-hooks run
  return h;
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  MG_CHECK(i < layers_.size(), IndexError, "Sequential: index ", i, " out of range (", layers_.size(), " layers)");
  return layers_[i];
}

}  // namespace mg::nn
