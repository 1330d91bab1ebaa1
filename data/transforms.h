// Per-sample image transforms (Normalize, RandomHorizontalFlip, RandomCrop with padding,
// Compose) whose randomness comes from a per-sample seed, so results never depend on workers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mg::data {

// A small counter-based RNG (splitmix64) for one sample. The DataLoader seeds it from
// (seed, epoch, sample index): the same sample gets the same draws whichever worker,
// or how many workers, load it.
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed) {}
  static SampleRng for_sample(uint64_t seed, int64_t epoch, int64_t index);
  uint64_t next();
  double uniform();                         // [0, 1)
  int64_t randint(int64_t lo, int64_t hi);  // [lo, hi]

 private:
  uint64_t state_;
};

// Transforms act on one sample's data: a CPU tensor [C, H, W] (or [H, W]). They return a
// new tensor (or the input when they change nothing) and are const: safe on many threads.
class Transform {
 public:
  virtual ~Transform() = default;
  virtual Tensor operator()(const Tensor& x, SampleRng& rng) const = 0;
  virtual std::string name() const = 0;
};
using TransformPtr = std::shared_ptr<const Transform>;

// (x - mean[c]) / std[c] per channel; one value broadcasts over all channels. Output f32
// (f64 stays f64); integer inputs are converted first.
class Normalize final : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor operator()(const Tensor& x, SampleRng& rng) const override;
  std::string name() const override { return "Normalize"; }

 private:
  std::vector<double> mean_, std_;
};

// Mirrors the last dim with probability p.
class RandomHorizontalFlip final : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor operator()(const Tensor& x, SampleRng& rng) const override;
  std::string name() const override { return "RandomHorizontalFlip"; }

 private:
  double p_;
};

// Pads H and W by `padding` on every side with `fill`, then cuts a random height x width
// window (torchvision's RandomCrop(size, padding)). The output keeps the input's dtype.
class RandomCrop final : public Transform {
 public:
  RandomCrop(int64_t height, int64_t width, int64_t padding = 0, double fill = 0.0);
  Tensor operator()(const Tensor& x, SampleRng& rng) const override;
  std::string name() const override { return "RandomCrop"; }

 private:
  int64_t height_, width_, padding_;
  double fill_;
};

// Applies transforms in order, sharing one SampleRng (so each draws its own numbers).
class Compose final : public Transform {
 public:
  explicit Compose(std::vector<TransformPtr> transforms);
  Tensor operator()(const Tensor& x, SampleRng& rng) const override;
  std::string name() const override;

 private:
  std::vector<TransformPtr> transforms_;
};

}  // namespace mg::data
