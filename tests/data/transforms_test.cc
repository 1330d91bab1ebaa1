// Transforms against hand-built references: Normalize per channel, flips, crops with padding
// (window positions re-drawn from the same SampleRng), Compose, and per-sample seeding.
#include <gtest/gtest.h>

#include <set>

#include "data/transforms.h"

namespace mg::data {
namespace {

// [C, H, W] with value c * 1000 + h * 10 + w.
Tensor coded_image(int64_t c, int64_t h, int64_t w, DType dt = DType::f32) {
  std::vector<float> v;
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t k = 0; k < w; ++k) v.push_back(static_cast<float>(i * 1000 + j * 10 + k));
  return raw::to_dtype(from_vector(v, {c, h, w}), dt);
}

TEST(Transforms, NormalizePerChannelAndBroadcast) {
  Tensor x = coded_image(2, 2, 3);
  SampleRng rng(1);
  Tensor y = Normalize({1.0, 1000.0}, {2.0, 4.0})(x, rng);
  auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (int64_t i = 0; i < 12; ++i) {
    const double m = i < 6 ? 1.0 : 1000.0, s = i < 6 ? 2.0 : 4.0;
    EXPECT_FLOAT_EQ(yv[i], static_cast<float>((xv[i] - m) / s)) << i;
  }
  EXPECT_EQ(x.to_vector<float>(), xv);  // input untouched
  Tensor z = Normalize({10.0}, {5.0})(raw::to_dtype(x, DType::f64), rng);
  EXPECT_EQ(z.dtype(), DType::f64);
  EXPECT_DOUBLE_EQ(z.to_vector<double>()[7], (1001.0 - 10.0) / 5.0);
  Tensor u = Normalize({0.5}, {0.25})(full({1, 2, 2}, 3, {DType::u8}), rng);
  EXPECT_EQ(u.dtype(), DType::f32);
  EXPECT_FLOAT_EQ(u.to_vector<float>()[3], 10.0f);
  EXPECT_THROW(Normalize({1, 2, 3}, {1, 1, 1})(x, rng), ShapeError);
  EXPECT_THROW(Normalize({1}, {0}), ValueError);
  EXPECT_THROW(Normalize({1, 2}, {1}), ValueError);
  EXPECT_THROW(Normalize({1}, {1})(zeros({2, 2, 2, 2}), rng), ShapeError);
}

TEST(Transforms, HorizontalFlip) {
  Tensor x = coded_image(2, 3, 4);
  SampleRng rng(7);
  Tensor y = RandomHorizontalFlip(1.0)(x, rng);
  auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(yv[r * 4 + k], xv[r * 4 + 3 - k]);
  EXPECT_TRUE(RandomHorizontalFlip(0.0)(x, rng).is_same(x));
  // Integer images and strided (non-contiguous) inputs.
  Tensor xi = raw::to_dtype(x, DType::i64);
  EXPECT_EQ(RandomHorizontalFlip(1.0)(xi, rng).to_vector<int64_t>(), raw::to_dtype(y, DType::i64).to_vector<int64_t>());
  Tensor xt = raw::transpose(coded_image(2, 4, 3), 1, 2);  // [2, 3, 4], strided
  Tensor ref = RandomHorizontalFlip(1.0)(raw::contiguous(xt), rng);
  EXPECT_EQ(RandomHorizontalFlip(1.0)(xt, rng).to_vector<float>(), ref.to_vector<float>());
  // p = 0.5 flips about half of many samples.
  int flips = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    SampleRng r = SampleRng::for_sample(3, 1, i);
    flips += !RandomHorizontalFlip(0.5)(x, r).is_same(x);
  }
  EXPECT_GT(flips, 430);
  EXPECT_LT(flips, 570);
  EXPECT_THROW(RandomHorizontalFlip(1.5), ValueError);
}

TEST(Transforms, RandomCropMatchesPaddedReference) {
  const int64_t C = 2, H = 5, W = 6, P = 2, OH = 4, OW = 5;
  Tensor x = coded_image(C, H, W);
  auto xv = x.to_vector<float>();
  std::set<std::pair<int64_t, int64_t>> origins;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SampleRng rng(seed), replay(seed);
    Tensor y = RandomCrop(OH, OW, P, -1.0)(x, rng);
    ASSERT_EQ(y.sizes(), (Shape{C, OH, OW}));
    const int64_t top = replay.randint(0, H + 2 * P - OH), left = replay.randint(0, W + 2 * P - OW);
    origins.insert({top, left});
    auto yv = y.to_vector<float>();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          const int64_t r = top + i - P, q = left + j - P;
          const float want = (r < 0 || r >= H || q < 0 || q >= W) ? -1.0f : xv[(c * H + r) * W + q];
          ASSERT_EQ(yv[(c * OH + i) * OW + j], want) << "seed " << seed << " at " << c << "," << i << "," << j;
        }
  }
  EXPECT_EQ(origins.size(), static_cast<size_t>((H + 2 * P - OH + 1) * (W + 2 * P - OW + 1)));  // every window
  SampleRng rng(0);
  // No padding, full size: the image itself.
  EXPECT_EQ(RandomCrop(H, W)(x, rng).to_vector<float>(), xv);
  // [H, W] images and u8 keep their rank and dtype.
  Tensor g = RandomCrop(3, 3, 1)(full({4, 4}, 9, {DType::u8}), rng);
  EXPECT_EQ(g.sizes(), (Shape{3, 3}));
  EXPECT_EQ(g.dtype(), DType::u8);
  EXPECT_THROW(RandomCrop(H + 5, W, 2)(x, rng), ShapeError);
  EXPECT_THROW(RandomCrop(0, 3), ValueError);
  EXPECT_THROW(RandomCrop(3, 3, -1), ValueError);
}

TEST(Transforms, ComposeAndPerSampleSeeds) {
  auto t = std::make_shared<Compose>(
      std::vector<TransformPtr>{std::make_shared<RandomCrop>(6, 6, 3), std::make_shared<RandomHorizontalFlip>(0.5),
                                std::make_shared<Normalize>(std::vector<double>{1.0}, std::vector<double>{2.0})});
  EXPECT_EQ(t->name(), "Compose(RandomCrop, RandomHorizontalFlip, Normalize)");
  Tensor x = coded_image(1, 6, 6);
  // Compose == applying the parts by hand with the same rng.
  SampleRng a = SampleRng::for_sample(5, 2, 17), b = SampleRng::for_sample(5, 2, 17);
  Tensor y = (*t)(x, a);
  Tensor r = Normalize({1.0}, {2.0})(RandomHorizontalFlip(0.5)(RandomCrop(6, 6, 3)(x, b), b), b);
  EXPECT_EQ(y.to_vector<float>(), r.to_vector<float>());
  // Same (seed, epoch, index): same output; another index or epoch: (almost always) another.
  std::set<std::vector<float>> outs;
  for (int64_t i = 0; i < 20; ++i) {
    SampleRng s = SampleRng::for_sample(5, 2, i), s2 = SampleRng::for_sample(5, 2, i);
    auto v = (*t)(x, s).to_vector<float>();
    EXPECT_EQ(v, (*t)(x, s2).to_vector<float>());
    outs.insert(v);
  }
  EXPECT_GT(outs.size(), 10u);
  EXPECT_NE(SampleRng::for_sample(5, 2, 0).next(), SampleRng::for_sample(5, 3, 0).next());
  EXPECT_NE(SampleRng::for_sample(5, 2, 0).next(), SampleRng::for_sample(6, 2, 0).next());
  EXPECT_THROW(Compose({nullptr}), ValueError);
}

}  // namespace
}  // namespace mg::data
