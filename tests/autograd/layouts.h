// The operand layouts the elementwise tests sweep every op over, shared by the op table (CPU
// gradients) and the CUDA parity test: sizes around vector widths and block sizes (1 to 4097),
// transposed, stepped and unaligned views, broadcasts and a 0-dim operand. The views are
// Tensor's methods: under autograd the gradient comes back through them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mg::testing {

using ViewFn = std::function<Tensor(const Tensor&)>;

// One operand: a tensor of shape `base`, then `view` of it.
struct Layout {
  std::string name;
  Shape base;
  ViewFn view;
};

// Two operands: tensors of shapes a and b, then va and vb of them.
struct BinaryLayout {
  std::string name;
  Shape a, b;
  ViewFn va, vb;
};

inline const std::vector<Layout>& unary_layouts() {
  const ViewFn id = [](const Tensor& t) { return t; };
  static const std::vector<Layout> v = {
      {"n1", {1}, id},
      {"n33", {33}, id},
      {"n1000", {1000}, id},
      {"n4097", {4097}, id},
      {"transposed", {40, 33}, [](const Tensor& t) { return t.transpose(0, 1); }},
      {"stepped", {33, 64}, [](const Tensor& t) { return t.slice(1, 1, 64, 2); }},
      {"offset", {4098}, [](const Tensor& t) { return t.slice(0, 1, 4098, 1); }},  // unaligned start
  };
  return v;
}

inline const std::vector<BinaryLayout>& binary_layouts() {
  const ViewFn id = [](const Tensor& t) { return t; };
  static const std::vector<BinaryLayout> v = {
      {"same1", {1}, {1}, id, id},
      {"same33", {33}, {33}, id, id},
      {"same4097", {4097}, {4097}, id, id},
      {"bcast_row_col", {33, 1}, {1, 40}, id, id},
      {"bcast_3d", {5, 1, 7}, {3, 1}, id, id},
      {"0dim_b", {1000}, {}, id, id},
      {"transposed", {40, 33}, {33, 40}, [](const Tensor& t) { return t.transpose(0, 1); }, id},
      {"stepped", {33, 64}, {33, 32}, [](const Tensor& t) { return t.slice(1, 0, 64, 2); }, id},
      {"unaligned", {4098}, {4097}, [](const Tensor& t) { return t.slice(0, 1, 4098, 1); }, id},
  };
  return v;
}

}  // namespace mg::testing
