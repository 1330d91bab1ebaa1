// Bad input to core's public surface: each case once crashed, wrapped around or returned a
// silently wrong tensor; each must now raise the mg::Error subclass naming the op and values.
// Built twice (tests/core/BUILD.bazel): with //core alone and with //autograd's recording hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mg {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// Runs f, expects an E whose message contains every one of `parts`.
template <class E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning \"" << parts.front() << "\"";
  } catch (const E& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// zeros({2^61}, f64) used to ask the allocator for 2^64 bytes == 0 and fill 2^61 elements
// into a 64-byte block; zeros({2^40, 2^40}) had numel 0 and summed to 0.
TEST(CheckedSizes, ByteAndElementCountsThatOverflowAreShapeErrors) {
  expect_error<ShapeError>([] { zeros({int64_t{1} << 61}, DType::f64); }, {"empty", "2305843009213693952", "8"});
  expect_error<ShapeError>([] { zeros({int64_t{1} << 40, int64_t{1} << 40}); }, {"empty", "1099511627776"});
  expect_error<ShapeError>([] { ones({3, kI64Max}); }, {"empty"});
  // No element, but strides that cannot be represented.
  expect_error<ShapeError>([] { empty({0, int64_t{1} << 40, int64_t{1} << 40}); }, {"contiguous_strides"});
  expect_error<ShapeError>([] { shape_numel({int64_t{1} << 32, int64_t{1} << 32}); }, {"numel"});
  EXPECT_EQ(shape_numel({0, int64_t{1} << 40, int64_t{1} << 40}), 0);
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "t"), int64_t{1} << 62);
  expect_error<ShapeError>([] { checked_add(kI64Max, 1, "t"); }, {"t: size overflow", "+"});
}

TEST(CheckedSizes, ViewsAndReshapesCheckTheirShapes) {
  Tensor t = arange(8, DType::f32);
  // -1 next to sizes whose product wraps to a divisor of 8 used to be accepted.
  expect_error<ShapeError>([&] { t.view({int64_t{1} << 62, 4, -1}); }, {"view"});
  expect_error<ShapeError>([&] { t.reshape({int64_t{1} << 32, int64_t{1} << 32, 0}); }, {"reshape"});
  expect_error<ShapeError>([&] { t.view({-3, -1}); }, {"view", "-3"});
  expect_error<ShapeError>([&] { t.view({-1, -1}); }, {"only one dimension can be -1"});
  EXPECT_EQ(t.view({2, -1}).sizes(), (Shape{2, 4}));
}

// expand({-2, 3}) used to give a tensor of numel -6.
TEST(CheckedSizes, ExpandRejectsNegativeAndOverflowingSizes) {
  Tensor t = ones({1, 3});
  expect_error<ShapeError>([&] { t.expand({-2, 3}); }, {"expand", "-2"});
  expect_error<ShapeError>([&] { t.expand({2, -5}); }, {"expand", "-5"});
  expect_error<ShapeError>([&] { t.expand({-1, 1, 3}); }, {"expand", "-1 only keeps an existing dim"});
  expect_error<ShapeError>([&] { ones({1}).expand({int64_t{1} << 32, int64_t{1} << 32}); }, {"as_strided"});
  Tensor e = t.expand({4, -1});  // -1 keeps the dim
  EXPECT_EQ(e.sizes(), (Shape{4, 3}));
  EXPECT_EQ(e.numel(), 12);
  // An expanded view counts more bytes than its storage holds, and nbytes says so exactly.
  Tensor big = ones({1}, DType::f64).expand({int64_t{1} << 31, int64_t{1} << 31});
  EXPECT_EQ(big.numel(), int64_t{1} << 62);
  expect_error<ShapeError>([&] { big.nbytes(); }, {"nbytes"});
}

TEST(CheckedSizes, FactoriesRejectNegativeSizes) {
  const Shape bad{2, -3};
  expect_error<ShapeError>([&] { empty(bad); }, {"empty", "[2, -3]"});
  expect_error<ShapeError>([&] { zeros(bad); }, {"[2, -3]"});
  expect_error<ShapeError>([&] { ones(bad); }, {"[2, -3]"});
  expect_error<ShapeError>([&] { full(bad, 1.0); }, {"[2, -3]"});
  expect_error<ShapeError>([&] { randn(bad); }, {"[2, -3]"});
  expect_error<ShapeError>([&] { rand(bad); }, {"[2, -3]"});
  expect_error<ShapeError>([&] { randint(0, 5, bad); }, {"[2, -3]"});
  expect_error<ValueError>([] { randperm(-1); }, {"randperm"});
}

// A view that reaches past its storage can only come from a bad raw::as_strided call (the
// kernels' building block); it used to read and write out of bounds.
TEST(CheckedSizes, AsStridedStaysInsideTheStorage) {
  Tensor t = zeros({6});
  EXPECT_EQ(raw::as_strided(t, {2, 3}, {3, 1}, 0).numel(), 6);
  expect_error<ShapeError>([&] { raw::as_strided(t, {2, 3}, {3, 1}, 1); }, {"as_strided", "reaches element 6"});
  expect_error<ShapeError>([&] { raw::as_strided(t, {7}, {1}, 0); }, {"as_strided"});
  expect_error<ShapeError>([&] { raw::as_strided(t, {2}, {-1}, 1); }, {"as_strided", "negative"});
  expect_error<ShapeError>([&] { raw::as_strided(t, {2}, {1, 1}, 0); }, {"as_strided"});
  expect_error<ShapeError>([&] { raw::as_strided(t, {3}, {kI64Max}, 0); }, {"as_strided", "size overflow"});
  EXPECT_EQ(raw::as_strided(t, {0, 5}, {100, 100}, 6).numel(), 0);  // empty: nothing is reached
}

// Every public method of a default-constructed Tensor used to dereference null.
TEST(UndefinedTensor, EveryMethodRaisesValueErrorNamingIt) {
  const Tensor u;
  Tensor m;
  const Tensor d = ones({2});
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"sizes", [&] { u.sizes(); }},
      {"shape", [&] { u.shape(); }},
      {"strides", [&] { u.strides(); }},
      {"size", [&] { u.size(0); }},
      {"stride", [&] { u.stride(0); }},
      {"dim", [&] { u.dim(); }},
      {"numel", [&] { u.numel(); }},
      {"offset", [&] { u.offset(); }},
      {"dtype", [&] { u.dtype(); }},
      {"device", [&] { u.device(); }},
      {"device", [&] { u.is_cuda(); }},
      {"dtype", [&] { u.element_size(); }},
      {"nbytes", [&] { u.nbytes(); }},
      {"is_contiguous", [&] { u.is_contiguous(); }},
      {"storage", [&] { u.storage(); }},
      {"raw_data", [&] { u.raw_data(); }},
      {"dtype", [&] { u.data_ptr<float>(); }},
      {"version", [&] { u.version(); }},
      {"bump_version", [&] { u.bump_version(); }},
      {"requires_grad", [&] { u.requires_grad(); }},
      {"requires_grad_", [&] { m.requires_grad_(); }},
      {"grad", [&] { u.grad(); }},
      {"set_grad", [&] { u.set_grad(Tensor()); }},
      {"is_leaf", [&] { u.is_leaf(); }},
      {"retain_grad", [&] { u.retain_grad(); }},
      {"detach", [&] { u.detach(); }},
      {"backward", [&] { u.backward(); }},
      {"view", [&] { u.view({1}); }},
      {"reshape", [&] { u.reshape({1}); }},
      {"permute", [&] { u.permute({0}); }},
      {"transpose", [&] { u.transpose(0, 1); }},
      {"t", [&] { u.t(); }},
      {"unsqueeze", [&] { u.unsqueeze(0); }},
      {"squeeze", [&] { u.squeeze(0); }},
      {"squeeze", [&] { u.squeeze(); }},
      {"flatten", [&] { u.flatten(); }},
      {"narrow", [&] { u.narrow(0, 0, 1); }},
      {"slice", [&] { u.slice(0, 0, 1); }},
      {"select", [&] { u.select(0, 0); }},
      {"expand", [&] { u.expand({2}); }},
      {"contiguous", [&] { u.contiguous(); }},
      {"clone", [&] { u.clone(); }},
      {"to", [&] { u.to(DType::f64); }},
      {"to", [&] { u.to(Device::cpu()); }},
      {"to", [&] { u.cpu(); }},
      {"copy_", [&] { m.copy_(d); }},
      {"fill_", [&] { m.fill_(1.0); }},
      {"zero_", [&] { m.zero_(); }},
      {"item", [&] { u.item(); }},
      {"to_vector", [&] { u.to_vector<float>(); }},
  };
  for (auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    expect_error<ValueError>(call, {name + ": called on an undefined tensor"});
  }
  expect_error<ValueError>([&] { Tensor(d).copy_(u); }, {"copy_", "undefined"});
  EXPECT_EQ(u.str(), "Tensor(undefined)");  // printing stays possible
  EXPECT_FALSE(u.defined());
}

// 2^63 bytes used to print as "--9223372036854775808 B" (negating INT64_MIN).
TEST(FormatBytes, PrintsTheWholeRangeInUnsignedArithmetic) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(uint64_t{1} << 63), "8.00 EiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<uint64_t>::max()), "16.00 EiB");
  EXPECT_EQ(format_bytes(kI64Min), "-8.00 EiB");
  EXPECT_EQ(format_bytes(int64_t{-512}), "-512 B");
  EXPECT_EQ(format_bytes(size_t{3} << 40), "3.00 TiB");
  EXPECT_EQ(format_bytes(5LL << 50), "5.00 PiB");
}

// A request within 63 bytes of SIZE_MAX used to round up to 0 and come back as a 64-byte block.
TEST(FormatBytes, CpuAllocatorRefusesImpossibleRequestsAndNamesTheSize) {
  expect_error<OutOfMemoryError>([] { cpu_allocator().allocate(std::numeric_limits<size_t>::max() - 10); },
                                 {"CpuAllocator", "16.00 EiB"});
  expect_error<OutOfMemoryError>([] { cpu_allocator().allocate(size_t{1} << 63); }, {"8.00 EiB"});
  expect_error<DeviceError>([] { CategoryStats::get(Device::cuda(-1)); }, {"-1"});
  expect_error<DeviceError>([] { CategoryStats::get(Device::cuda(64)); }, {"64"});
}

TEST(PublicSurface, DimsAndIndicesOutOfRangeAreIndexErrors) {
  Tensor t = arange(24, DType::f32).view({2, 3, 4});
  Tensor s = scalar_tensor(1.0);
  // size(0) of a 0-dim tensor used to read past an empty vector.
  expect_error<IndexError>([&] { s.size(0); }, {"size", "0-dim"});
  expect_error<IndexError>([&] { s.stride(-1); }, {"stride", "0-dim"});
  expect_error<IndexError>([&] { t.size(3); }, {"size", "3"});
  expect_error<IndexError>([&] { t.transpose(0, 3); }, {"transpose"});
  expect_error<IndexError>([&] { t.permute({0, 1, 5}); }, {"permute"});
  expect_error<ShapeError>([&] { t.permute({0, 1, 1}); }, {"permute", "repeated"});
  expect_error<IndexError>([&] { t.select(1, 3); }, {"select", "3"});
  expect_error<IndexError>([&] { t.select(1, -4); }, {"select"});
  expect_error<IndexError>([&] { t.unsqueeze(5); }, {"unsqueeze"});
  expect_error<IndexError>([&] { t.squeeze(-4); }, {"squeeze"});
  expect_error<IndexError>([&] { t.flatten(0, 3); }, {"flatten"});
  expect_error<IndexError>([&] { t.narrow(3, 0, 1); }, {"narrow"});
  expect_error<ValueError>([&] { t.slice(0, 0, 2, 0); }, {"slice", "step"});
  expect_error<ShapeError>([&] { s.select(0, 0); }, {"select", "0-dim"});
  // start + length used to overflow into a negative end that the check let through.
  expect_error<IndexError>([&] { t.narrow(2, 1, kI64Max); }, {"narrow", "exceeds"});
  expect_error<ValueError>([&] { t.narrow(2, 1, -1); }, {"narrow", "non-negative"});
  EXPECT_EQ(t.narrow(2, 4, 0).numel(), 0);
}

// (end - start + step - 1) / step used to overflow for a huge step and give a negative size.
TEST(PublicSurface, SliceWithAHugeStepTakesOneElement) {
  Tensor t = arange(10, DType::f32);
  Tensor one = t.slice(0, 2, 10, kI64Max);
  ASSERT_EQ(one.sizes(), (Shape{1}));
  EXPECT_EQ(one.item(), 2.0);
  EXPECT_EQ(t.slice(0, 3, 3, kI64Max).numel(), 0);
  EXPECT_EQ(t.slice(0, kI64Min, kI64Max, 3).to_vector<float>(), (std::vector<float>{0, 3, 6, 9}));
  EXPECT_EQ(t.slice(0, -3, kI64Max).to_vector<float>(), (std::vector<float>{7, 8, 9}));
}

// Values an integer tensor cannot hold used to be cast with undefined behaviour (NaN -> i64).
TEST(PublicSurface, IntegerFillsRejectValuesTheTypeCannotHold) {
  expect_error<ValueError>([] { full({2}, 1e20, DType::i32); }, {"fill_", "i32"});
  expect_error<ValueError>([] { full({2}, std::nan(""), DType::i64); }, {"fill_", "nan"});
  expect_error<ValueError>([] { full({2}, 0x1p63, DType::i64); }, {"fill_"});
  expect_error<ValueError>([] { full({2}, 256, DType::u8); }, {"fill_", "256"});
  expect_error<ValueError>([] { full({2}, -1, DType::u8); }, {"fill_"});
  expect_error<ValueError>([] { zeros({2}, DType::i32).fill_(std::numeric_limits<double>::infinity()); }, {"fill_"});
  // The edges of each range are fine, and a float tensor takes anything.
  EXPECT_EQ(full({1}, 255, DType::u8).item(), 255);
  EXPECT_EQ(full({1}, -2147483648.0, DType::i32).item(), -2147483648.0);
  EXPECT_EQ(full({1}, -0x1p63, DType::i64).item<int64_t>(), kI64Min);
  EXPECT_TRUE(std::isinf(full({1}, -std::numeric_limits<double>::infinity()).item()));
  EXPECT_EQ(full({1}, 7.0, DType::b8).item(), 1.0);
}

// arange(0, inf) used to cast inf to int64 (undefined); NaN and 1e300 steps likewise.
TEST(PublicSurface, ArangeAndRandomFactoriesCheckTheirArguments) {
  const double inf = std::numeric_limits<double>::infinity();
  expect_error<ValueError>([&] { arange(0, inf); }, {"arange", "finite"});
  expect_error<ValueError>([&] { arange(0, std::nan("")); }, {"arange"});
  expect_error<ValueError>([&] { arange(0, 1, -1); }, {"arange", "inconsistent"});
  expect_error<ShapeError>([&] { arange(0, 1e300, 1e-300); }, {"arange", "elements"});
  EXPECT_EQ(arange(0, 1, 0.25).numel(), 4);
  expect_error<ValueError>([] { randint(kI64Min, kI64Max, {2}); }, {"randint"});
  expect_error<ValueError>([] { uniform({2}, 1.0, 0.0); }, {"uniform_"});
  expect_error<ValueError>([&] { uniform({2}, 0.0, inf); }, {"uniform_"});
  expect_error<ValueError>([] { normal({2}, 0.0, std::nan("")); }, {"normal_"});
  expect_error<ValueError>([] { normal({2}, std::nan(""), 1.0); }, {"normal_"});
  // randperm goes through the allocator: a size no memory holds is an mg::Error, not bad_alloc.
  EXPECT_THROW(randperm(int64_t{1} << 62), Error);
  Tensor p = randperm(5);
  std::vector<int64_t> v = p.to_vector<int64_t>();
  std::sort(v.begin(), v.end());
  EXPECT_EQ(v, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  Tensor r = randint(kI64Min, kI64Min + 3, {64});
  for (int64_t x : r.to_vector<int64_t>()) EXPECT_TRUE(x >= kI64Min && x < kI64Min + 3) << x;
}

}  // namespace
}  // namespace mg
