// Counter-based random numbers (Philox4x32-10): a Generator is a seed plus an offset, so a
// stream of numbers can be replayed exactly (checkpoint replay, dropout masks) on any device.
#pragma once

#include <cstdint>
#include <mutex>

#include "core/philox.h"
#include "core/tensor.h"

namespace mg {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in 4-number blocks already consumed
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) { state_.seed = seed; }
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return state_.seed; }
  PhiloxState get_state() const;
  void set_state(PhiloxState s);
  // Reserves `blocks` Philox blocks and returns the offset they start at.
  uint64_t reserve(uint64_t blocks);

 private:
  mutable std::mutex mu_;
  PhiloxState state_;
};

// The process-wide default generator (seeded with manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Uniform [low, high) and normal(mean, std) tensors, floating dtypes only.
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {}, Generator* gen = nullptr);
// In-place fills (raw, not differentiable).
void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);
// Bernoulli(p) mask as the tensor's dtype (1 = keep with probability p).
void bernoulli_(const Tensor& t, double p, Generator* gen = nullptr);
// Random permutation of 0..n-1 (i64, CPU).
Tensor randperm(int64_t n, Generator* gen = nullptr);
// Random integers in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = {DType::i64},
               Generator* gen = nullptr);

}  // namespace mg
