// Counter-based random numbers (Philox4x32-10): a Generator is a seed plus an offset, so a
// stream of numbers can be replayed exactly (checkpoint replay, dropout masks) on any device.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

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

// CUDA graph capture (core/cuda/graph.cc). While a capture records on this thread, CUDA random
// fills leave their generator alone: each reads its offset from a device counter the graph
// owns, plus its place within the graph. Before each replay the graph reserves the blocks its
// fills draw from the generator and writes where they start into that counter, so every replay
// draws fresh numbers, the very ones eager execution would draw at that point.
struct CapturedRng {
  Generator* gen = nullptr;
  uint64_t seed = 0;    // the seed the capture recorded (a reseed since is an error at replay)
  uint64_t blocks = 0;  // Philox blocks one replay draws
  Tensor offset;        // i64 [1] on the capture's device
};
void begin_rng_capture();
std::vector<CapturedRng> end_rng_capture();
// Before a replay, on the current stream: each generator's blocks reserved, the start written.
void prepare_rng_replay(const std::vector<CapturedRng>& rngs);

// `blocks` Philox blocks reserved from `gen` (the default generator when null) for a kernel on
// `dev` that computes its own numbers (the fused dropout): the seed, the first block's offset
// and, inside a CUDA graph capture, the graph's device counter that each replay adds to the
// offset (null otherwise). Block k then holds the numbers of elements 4k..4k+3, as in a fill.
struct PhiloxDraw {
  uint64_t seed = 0;
  uint64_t base = 0;
  const int64_t* device_offset = nullptr;
};
PhiloxDraw reserve_philox(Generator* gen, uint64_t blocks, const Device& dev);

// The process-wide default generator (seeded with manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Puts a generator back in the state it had when the scope began. Measurements that run the
// model (profiling, trial steps: their dropout draws from the default generator) hold one, so the
// program's random stream continues as if they had not run.
class GeneratorStateGuard {
 public:
  explicit GeneratorStateGuard(Generator& gen = default_generator()) : gen_(gen), state_(gen.get_state()) {}
  ~GeneratorStateGuard() { gen_.set_state(state_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  Generator& gen_;
  PhiloxState state_;
};

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
