#include "data/transforms.h"

#include <cstring>

namespace mg::data {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// C, H, W of an image tensor ([C, H, W] or [H, W]); anything else is a ShapeError naming op.
void image_dims(const Tensor& x, const char* op, int64_t* c, int64_t* h, int64_t* w) {
  MG_CHECK(x.defined(), ValueError, op, ": undefined input");
  MG_CHECK(x.device().is_cpu(), DeviceError, op, ": expected a CPU tensor, got one on ", x.device());
  MG_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, op, ": expected an image [C, H, W] or [H, W], got shape ",
           shape_str(x.sizes()));
  *c = x.dim() == 3 ? x.size(0) : 1;
  *h = x.size(x.dim() - 2);
  *w = x.size(x.dim() - 1);
}

}  // namespace

SampleRng SampleRng::for_sample(uint64_t seed, int64_t epoch, int64_t index) {
  // Three rounds of mixing keep neighbouring (epoch, index) pairs uncorrelated.
  uint64_t s = splitmix(seed);
  s = splitmix(s ^ static_cast<uint64_t>(epoch));
  s = splitmix(s ^ static_cast<uint64_t>(index));
  return SampleRng(s);
}

uint64_t SampleRng::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SampleRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int64_t SampleRng::randint(int64_t lo, int64_t hi) {
  MG_CHECK(lo <= hi, ValueError, "SampleRng::randint: empty range [", lo, ", ", hi, "]");
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(span == 0 ? next() : next() % span);
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  MG_CHECK(!mean_.empty() && mean_.size() == std_.size(), ValueError, "Normalize: mean has ", mean_.size(),
           " values and std has ", std_.size(), "; they need the same, non-zero count");
  for (size_t i = 0; i < std_.size(); ++i)
    MG_CHECK(std_[i] > 0, ValueError, "Normalize: std[", i, "] must be > 0, got ", std_[i]);
}

Tensor Normalize::operator()(const Tensor& x, SampleRng&) const {
  int64_t c, h, w;
  image_dims(x, "Normalize", &c, &h, &w);
  MG_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == c, ShapeError, "Normalize: ", mean_.size(),
           " means for an image with ", c, " channels (shape ", shape_str(x.sizes()), ")");
  const DType out_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = raw::clone(raw::to_dtype(x, out_dtype));  // fresh, contiguous: safe to write
  const int64_t plane = h * w;
  for (int64_t ch = 0; ch < c; ++ch) {
    const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(ch);
    const double scale = 1.0 / std_[k], shift = -mean_[k] / std_[k];
    if (out_dtype == DType::f32) {
      float* p = out.data_ptr<float>() + ch * plane;
      const float s = static_cast<float>(scale), b = static_cast<float>(shift);
      for (int64_t i = 0; i < plane; ++i) p[i] = p[i] * s + b;
    } else {
      double* p = out.data_ptr<double>() + ch * plane;
      for (int64_t i = 0; i < plane; ++i) p[i] = p[i] * scale + shift;
    }
  }
  return out;
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  MG_CHECK(p >= 0.0 && p <= 1.0, ValueError, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::operator()(const Tensor& x, SampleRng& rng) const {
  int64_t c, h, w;
  image_dims(x, "RandomHorizontalFlip", &c, &h, &w);
  // Always draw, so the transforms after this one see the same stream whatever the outcome.
  if (!(rng.uniform() < p_)) return x;
  Tensor src = raw::contiguous(x);
  Tensor out = empty(x.sizes(), {x.dtype(), Device::cpu()});
  const size_t es = x.element_size();
  const auto* s = static_cast<const char*>(src.raw_data());
  auto* d = static_cast<char*>(out.raw_data());
  for (int64_t row = 0; row < c * h; ++row)
    for (int64_t j = 0; j < w; ++j) std::memcpy(d + (row * w + j) * es, s + (row * w + (w - 1 - j)) * es, es);
  return out;
}

RandomCrop::RandomCrop(int64_t height, int64_t width, int64_t padding, double fill)
    : height_(height), width_(width), padding_(padding), fill_(fill) {
  MG_CHECK(height >= 1 && width >= 1, ValueError, "RandomCrop: size must be >= 1, got ", height, "x", width);
  MG_CHECK(padding >= 0, ValueError, "RandomCrop: padding must be >= 0, got ", padding);
}

Tensor RandomCrop::operator()(const Tensor& x, SampleRng& rng) const {
  int64_t c, h, w;
  image_dims(x, "RandomCrop", &c, &h, &w);
  const int64_t ph = h + 2 * padding_, pw = w + 2 * padding_;
  MG_CHECK(height_ <= ph && width_ <= pw, ShapeError, "RandomCrop: crop ", height_, "x", width_,
           " is larger than the padded image ", ph, "x", pw, " (input ", shape_str(x.sizes()), ", padding ", padding_,
           ")");
  // Window origin in padded coordinates.
  const int64_t top = rng.randint(0, ph - height_), left = rng.randint(0, pw - width_);
  Shape out_shape = x.sizes();
  out_shape[out_shape.size() - 2] = height_;
  out_shape[out_shape.size() - 1] = width_;
  Tensor out = empty(out_shape, {x.dtype(), Device::cpu()});
  raw::fill_(out, fill_);
  Tensor src = raw::contiguous(x);
  const size_t es = x.element_size();
  const auto* s = static_cast<const char*>(src.raw_data());
  auto* d = static_cast<char*>(out.raw_data());
  // The part of the window that lies on the image; the rest keeps `fill`.
  const int64_t col0 = std::max<int64_t>(left, padding_), col1 = std::min<int64_t>(left + width_, padding_ + w);
  if (col1 <= col0) return out;
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < height_; ++i) {
      const int64_t r = top + i - padding_;  // source row
      if (r < 0 || r >= h) continue;
      std::memcpy(d + ((ch * height_ + i) * width_ + (col0 - left)) * es,
                  s + ((ch * h + r) * w + (col0 - padding_)) * es, static_cast<size_t>(col1 - col0) * es);
    }
  return out;
}

Compose::Compose(std::vector<TransformPtr> transforms) : transforms_(std::move(transforms)) {
  for (size_t i = 0; i < transforms_.size(); ++i)
    MG_CHECK(transforms_[i] != nullptr, ValueError, "Compose: transform ", i, " is null");
}

Tensor Compose::operator()(const Tensor& x, SampleRng& rng) const {
  Tensor y = x;
  for (const auto& t : transforms_) y = (*t)(y, rng);
  return y;
}

std::string Compose::name() const {
  std::string s = "Compose(";
  for (size_t i = 0; i < transforms_.size(); ++i) s += (i ? ", " : "") + transforms_[i]->name();
  return s + ")";
}

}  // namespace mg::data
