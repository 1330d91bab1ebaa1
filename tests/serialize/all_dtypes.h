// A state dict with one tensor of every dtype, for the safetensors round-trip and fuzz tests.
#pragma once

#include "core/random.h"
#include "core/state_dict.h"
#include "core/tensor.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test

// One tensor of every dtype, with scalars, empty and non-contiguous tensors among them.
inline StateDict all_dtypes() {
  StateDict sd;
  sd.tensors["f64"] = randn({3, 4}, {DType::f64});
  sd.tensors["f32"] = randn({5}, {DType::f32});
  sd.tensors["f16"] = randn({2, 3}, {DType::f16});
  sd.tensors["bf16"] = randn({7}, {DType::bf16});
  sd.tensors["i64"] = randint(-1000000, 1000000, {4, 2});
  sd.tensors["i32"] = randint(-5000, 5000, {6}, {DType::i32});
  sd.tensors["u8"] = randint(0, 256, {9}, {DType::u8});
  sd.tensors["bool"] = randint(0, 2, {3, 3}, {DType::b8});
  sd.tensors["scalar"] = scalar_tensor(3.5, {DType::f32});
  sd.tensors["empty"] = empty({0, 3}, {DType::f32});
  sd.tensors["layer.0.transposed"] = randn({4, 6}).t();  // non-contiguous: saved in logical order
  sd.meta = {
      {"step", 12345}, {"lr", 0.1}, {"name", "run"}, {"big", 18446744073709551615ull}, {"nested", {{"a", {1, 2, 3}}}}};
  return sd;
}

}  // namespace mg::nn
