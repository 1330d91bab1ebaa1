// Core tensor tests: storage sharing of views, factories, dtype conversions, RNG, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>

#include "core/allocator.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mg {
namespace {

TEST(DType, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = Half::to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(Half(f))));
      continue;
    }
    EXPECT_EQ(Half(f).x, h) << "half bits " << h << " -> " << f;
  }
}

TEST(DType, HalfRoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(Half(1.0f + 1.0f / 2048)), 1.0f);                // tie -> even
  EXPECT_EQ(static_cast<float>(Half(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);  // tie -> even (up)
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(70000.0f))));
  EXPECT_EQ(static_cast<float>(Half(65504.0f)), 65504.0f);
  EXPECT_EQ(static_cast<float>(Half(5.96046448e-8f)), 5.96046448e-8f);  // smallest subnormal
}

TEST(DType, BFloat16Rounding) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.00390625f)), 1.0f);  // tie -> even
  EXPECT_NEAR(static_cast<float>(BFloat16(3.14159f)), 3.140625f, 1e-6);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, Promotion) {
  EXPECT_EQ(promote_types(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote_types(DType::i64, DType::f16), DType::f16);
  EXPECT_EQ(promote_types(DType::b8, DType::u8), DType::u8);
  EXPECT_EQ(promote_types(DType::f32, DType::f64), DType::f64);
}

TEST(Device, Parse) {
  EXPECT_TRUE(Device("cpu").is_cpu());
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_EQ(Device("cuda").str(), "cuda:0");
  EXPECT_THROW(Device("gpu"), ValueError);
  EXPECT_THROW(Device("cuda:x"), ValueError);
}

TEST(Tensor, FactoriesAndItem) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.dtype(), DType::f32);
  for (float v : z.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  Tensor f = full({2}, 2.5, DType::f64);
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  Tensor a2 = arange(0.0, 1.0, 0.25, DType::f32);
  EXPECT_EQ(a2.to_vector<float>(), (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  EXPECT_DOUBLE_EQ(scalar_tensor(4.0).item(), 4.0);
  EXPECT_THROW(zeros({2}).item(), ValueError);
  EXPECT_THROW(empty({2, -1}), ShapeError);
  EXPECT_THROW(from_vector(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
}

TEST(Tensor, RawViewsShareStorageAndSeeWrites) {
  Tensor t = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tr = raw::transpose(t, 0, 1);
  EXPECT_EQ(tr.sizes(), (Shape{3, 2}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.storage(), t.storage());
  Tensor row = raw::select(t, 0, 1);
  raw::fill_(row, 9);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2, 9, 9, 9}));
  EXPECT_EQ(raw::contiguous(tr).to_vector<float>(), (std::vector<float>{0, 9, 1, 9, 2, 9}));
  Tensor sl = raw::slice(t, 1, 0, 3, 2);
  EXPECT_EQ(sl.sizes(), (Shape{2, 2}));
  EXPECT_EQ(raw::contiguous(sl).to_vector<float>(), (std::vector<float>{0, 2, 9, 9}));
  Tensor ex = raw::expand(raw::view(arange(3, DType::f32), {1, 3}), {4, 3});
  EXPECT_EQ(ex.strides()[0], 0);
  EXPECT_EQ(raw::contiguous(ex).to_vector<float>()[10], 1.0f);
  EXPECT_EQ(t.version(), tr.version());
}

TEST(Tensor, ViewRules) {
  Tensor t = arange(24, DType::f32);
  Tensor v = raw::view(t, {2, -1, 4});
  EXPECT_EQ(v.sizes(), (Shape{2, 3, 4}));
  Tensor p = raw::permute(v, {2, 0, 1});
  EXPECT_THROW(raw::view(p, {24}), ShapeError);  // not viewable without a copy
  Tensor r = raw::reshape(p, {24});              // reshape copies instead
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_NE(r.storage(), t.storage());
  EXPECT_THROW(raw::view(t, {5, -1}), ShapeError);
  EXPECT_THROW(raw::view(t, {-1, -1}), ShapeError);
  EXPECT_THROW(raw::permute(v, {0, 0, 1}), ShapeError);
  EXPECT_THROW(raw::transpose(v, 0, 3), IndexError);
  EXPECT_THROW(raw::select(v, 1, 3), IndexError);
  EXPECT_THROW(raw::expand(v, {3, 3, 4}), ShapeError);
  Tensor u = raw::unsqueeze(v, -1);
  EXPECT_EQ(u.sizes(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(raw::squeeze(u, -1).sizes(), (Shape{2, 3, 4}));
}

TEST(Tensor, CastsBetweenAllDtypes) {
  // Every value has at most 7 significant bits, so each floating dtype (bf16 keeps 8) holds it
  // exactly and the round trip must be exact; integer types truncate toward zero (-2.5 -> -2).
  std::vector<double> vals{-2.5, 0.0, 1.0, 3.75, 100.0};
  Tensor src = from_vector(vals, {5});
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    Tensor c = raw::to_dtype(src, d);
    EXPECT_EQ(c.dtype(), d);
    auto back = c.to_vector<double>();
    for (size_t i = 0; i < vals.size(); ++i) {
      double want = is_floating(d) ? vals[i] : std::trunc(vals[i]);
      EXPECT_EQ(back[i], want) << dtype_name(d) << " element " << i;
    }
  }
  Tensor b = raw::to_dtype(src, DType::b8);
  EXPECT_EQ(b.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1, 1, 1}));
}

// NaN and values outside every integer type's range convert to defined results (C++ leaves them
// undefined; UBSan's float-cast-overflow check flags them): NaN -> 0, saturation at int64's
// limits, then narrowing modulo 2^bits, as the CUDA cast does (cuda_runtime_test compares).
TEST(Tensor, FloatToIntegerCastsAreDefinedOutOfRange) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  Tensor src = from_vector(std::vector<double>{nan, 1e30, -1e30, inf, -inf, 3.7, -3.7, 300.0}, {8});
  for (DType from : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    Tensor f = raw::to_dtype(src, from);  // f16 turns 1e30 into inf: the same saturation
    EXPECT_EQ(raw::to_dtype(f, DType::i64).to_vector<int64_t>(),
              (std::vector<int64_t>{0, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 3, -3, 300}))
        << dtype_name(from);
    // INT64_MAX keeps its low 32 bits (all ones, -1); INT64_MIN's are zero.
    EXPECT_EQ(raw::to_dtype(f, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{0, -1, 0, -1, 0, 3, -3, 300}))
        << dtype_name(from);
    // u8 keeps the low 8 bits: 255, 0, -3 -> 253, 300 -> 44.
    EXPECT_EQ(raw::to_dtype(f, DType::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 255, 0, 255, 0, 3, 253, 44}))
        << dtype_name(from);
  }
}

// Values between two representable neighbours round to the nearest, ties to the even one
// (IEEE round-to-nearest-even): 1 + 2^-p lies halfway between 1 and 1 + 2^-(p-1) for a dtype
// with p - 1 fraction bits (f16: 10, bf16: 7), so it rounds down to 1 (even), and 1 + 3 * 2^-p
// rounds up to 1 + 2^-(p-2) (even); just above the halfway point rounds up.
TEST(Tensor, HalfCastsRoundToNearestEven) {
  for (auto [d, p] : {std::pair{DType::f16, 11}, std::pair{DType::bf16, 8}}) {
    const double h = std::ldexp(1.0, -p);
    Tensor src = from_vector(std::vector<double>{1 + h, 1 + 3 * h, 1 + h + h / 4, -(1 + h), 1 + h / 2}, {5});
    auto back = raw::to_dtype(raw::to_dtype(src, d), DType::f64).to_vector<double>();
    EXPECT_EQ(back, (std::vector<double>{1, 1 + 4 * h, 1 + 2 * h, -1, 1})) << dtype_name(d);
  }
}

TEST(Tensor, PrintingSummarizesLargeTensors) {
  std::string s = tensor({1, 2, 3, 4}, {2, 2}).str();
  EXPECT_NE(s.find("[[1, 2],"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2, 2]"), std::string::npos);
  std::string big = arange(1000, DType::f32).str();
  EXPECT_NE(big.find("..."), std::string::npos);
  EXPECT_LT(big.size(), 200u);
}

TEST(Random, PhiloxReproducibleAndSeeded) {
  Generator g1(42), g2(42), g3(43);
  Tensor a = randn({1000}, {}, &g1), b = randn({1000}, {}, &g2), c = randn({1000}, {}, &g3);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  Tensor d = randn({1000}, {}, &g1);  // the generator advanced
  EXPECT_NE(a.to_vector<float>(), d.to_vector<float>());
  // Moments of 100k normals and uniforms.
  Generator g(7);
  auto n = randn({100000}, DType::f64, &g).to_vector<double>();
  double m = 0, v = 0;
  for (double x : n) m += x;
  m /= n.size();
  for (double x : n) v += (x - m) * (x - m);
  v /= n.size();
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(v, 1.0, 0.02);
  auto u = rand({100000}, DType::f64, &g).to_vector<double>();
  double um = 0;
  for (double x : u) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    um += x;
  }
  EXPECT_NEAR(um / u.size(), 0.5, 0.01);
  // State save/restore replays the same numbers (what checkpoint replay relies on).
  PhiloxState s = g.get_state();
  auto r1 = rand({10}, {}, &g).to_vector<float>();
  g.set_state(s);
  EXPECT_EQ(rand({10}, {}, &g).to_vector<float>(), r1);
  auto perm = randperm(100, &g).to_vector<int64_t>();
  std::vector<bool> seen(100, false);
  for (int64_t p : perm) seen[p] = true;
  for (bool x : seen) EXPECT_TRUE(x);
  EXPECT_THROW(randn({2}, DType::i64), DTypeError);
}

TEST(Memory, CpuStatsTrackAllocationsAndCategories) {
  int64_t before = memory_allocated();
  int64_t cat_before = CategoryStats::get(Device::cpu()).counter(MemoryCategory::Parameters).current;
  {
    MemoryCategoryGuard g(MemoryCategory::Parameters);
    Tensor t = empty({1024}, DType::f32);
    EXPECT_EQ(memory_allocated() - before, 4096);
    EXPECT_GE(max_memory_allocated(), memory_allocated());
    EXPECT_EQ(CategoryStats::get(Device::cpu()).counter(MemoryCategory::Parameters).current - cat_before, 4096);
    EXPECT_EQ(MemoryCategoryGuard::current(), MemoryCategory::Parameters);
  }
  EXPECT_EQ(memory_allocated(), before);
  EXPECT_EQ(CategoryStats::get(Device::cpu()).counter(MemoryCategory::Parameters).current, cat_before);
  EXPECT_EQ(MemoryCategoryGuard::current(), MemoryCategory::Other);
  reset_peak_memory_stats();
  EXPECT_EQ(max_memory_allocated(), memory_allocated());
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

TEST(Errors, MessagesNameTheOp) {
  try {
    raw::view(arange(6, DType::f32), {4, 2});
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("view"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[4, 2]"), std::string::npos);
  }
  try {
    zeros({2}).data_ptr<double>();
    FAIL();
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos);
  }
  EXPECT_THROW(allocator_for(Device::cuda(0)).device(), DeviceError);
}

}  // namespace
}  // namespace mg
