// kernels/conv.h, pool.h, norm.h on the CPU: hand-computed conv/pool/batch-norm values, a naive
// seven-loop convolution (forward and both backwards) as the reference for every
// stride/padding/dilation/groups combination, layouts, and bad input.
#include <cmath>
#include <functional>

#include "kernels/ops.h"
#include "tests/kernels/test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

// Visits every (n, o, oh, ow, c, i, j) of a convolution whose input element is in range,
// with flat indices into x [N,C,H,W], w [O,Cg,kh,kw] and out [N,O,Ho,Wo].
void naive_conv_visit(const Shape& xs, const Shape& ws, const Shape& os, const k::Conv2dArgs& a,
                      const std::function<void(int64_t xi, int64_t wi, int64_t oi)>& f) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], Cg = ws[1], kh = ws[2], kw = ws[3];
  const int64_t Og = O / a.groups, Ho = os[2], Wo = os[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow)
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * a.stride.h - a.padding.h + i * a.dilation.h;
                const int64_t iw = ow * a.stride.w - a.padding.w + j * a.dilation.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t ci = (o / Og) * Cg + c;
                f(((n * C + ci) * H + ih) * W + iw, ((o * Cg + c) * kh + i) * kw + j,
                  ((n * O + o) * Ho + oh) * Wo + ow);
              }
}

struct ConvCase {
  Shape x, w;
  k::Conv2dArgs a;
  bool bias;
};

void check_against_naive(const ConvCase& cc, DType dt, double tol) {
  SCOPED_TRACE("x " + shape_str(cc.x) + " w " + shape_str(cc.w) + " groups " + std::to_string(cc.a.groups));
  Tensor x = randn(cc.x, {dt}), w = randn(cc.w, {dt});
  Tensor b = cc.bias ? randn({cc.w[0]}, {dt}) : Tensor();
  Tensor out = k::conv2d_forward(x, w, b, cc.a);
  const auto xv = vals(x), wv = vals(w), ov = vals(out);
  std::vector<double> ref(ov.size(), 0.0);
  if (cc.bias) {
    const auto bv = vals(b);
    const int64_t L = out.size(2) * out.size(3);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = bv[(i / L) % cc.w[0]];
  }
  naive_conv_visit(cc.x, cc.w, out.sizes(), cc.a,
                   [&](int64_t xi, int64_t wi, int64_t oi) { ref[oi] += xv[xi] * wv[wi]; });
  expect_near(out, ref, tol);

  // Backward: the adjoints of the same sum.
  Tensor g = randn(out.sizes(), {dt});
  const auto gv = vals(g);
  std::vector<double> rgx(xv.size(), 0.0), rgw(wv.size(), 0.0);
  naive_conv_visit(cc.x, cc.w, out.sizes(), cc.a, [&](int64_t xi, int64_t wi, int64_t oi) {
    rgx[xi] += gv[oi] * wv[wi];
    rgw[wi] += gv[oi] * xv[xi];
  });
  expect_near(k::conv2d_backward_input(g, w, cc.x, cc.a), rgx, tol);
  expect_near(k::conv2d_backward_weight(g, x, cc.w, cc.a), rgw, tol);
}

TEST(Conv2d, HandComputed) {
  // 1x1x3x3 input, 2x2 kernel of ones plus bias 10: each output is a 2x2 window sum + 10.
  Tensor x = T({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = T({1, 1, 1, 1}, {1, 1, 2, 2});
  Tensor out = k::conv2d_forward(x, w, T({10}, {1}), {});
  EXPECT_EQ(out.sizes(), (Shape{1, 1, 2, 2}));
  expect_near(out, {22, 26, 34, 38});
  // Padding 1, stride 2: windows at (-1,-1), (-1,1), (1,-1), (1,1).
  k::Conv2dArgs a;
  a.stride = 2;
  a.padding = 1;
  expect_near(k::conv2d_forward(x, w, Tensor(), a), {1, 5, 11, 28});
  // A 3x3 kernel with dilation 2 on a 5x5 input reads the corners and edge midpoints.
  Tensor x5 = raw::view(arange(0, 25, 1, {DType::f32}), {1, 1, 5, 5});
  k::Conv2dArgs d;
  d.dilation = 2;
  expect_near(k::conv2d_forward(x5, ones({1, 1, 3, 3}), Tensor(), d), {0 + 2 + 4 + 10 + 12 + 14 + 20 + 22 + 24});
}

TEST(Conv2d, MatchesNaiveReference) {
  auto args = [](Int2 s, Int2 p, Int2 d, int64_t g) { return k::Conv2dArgs{s, p, d, g}; };
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 5}, {4, 3, 3, 2}, args(1, 0, 1, 1), true},               // odd sizes, non-square kernel
      {{2, 3, 7, 5}, {4, 3, 3, 2}, args({2, 1}, {1, 2}, 1, 1), false},    // asymmetric stride/padding
      {{1, 2, 9, 8}, {3, 2, 3, 3}, args(2, 2, {2, 3}, 1), true},          // dilation
      {{2, 4, 6, 6}, {6, 2, 3, 3}, args(1, 1, 1, 2), true},               // groups
      {{2, 4, 6, 5}, {4, 1, 3, 3}, args(1, 1, 1, 4), false},              // depthwise
      {{2, 3, 5, 5}, {6, 1, 2, 2}, args(1, 0, 1, 3), true},               // depthwise, multiplier 2
      {{3, 5, 4, 4}, {2, 5, 1, 1}, args(1, 0, 1, 1), true},               // 1x1
      {{1, 2, 3, 3}, {2, 2, 3, 3}, args(3, 1, 1, 1), true},               // stride larger than the output
      {{0, 2, 4, 4}, {3, 2, 3, 3}, args(1, 1, 1, 1), true},               // empty batch
      {{2, 4, 20, 18}, {6, 2, 3, 3}, args({1, 2}, 1, 1, 2), true},        // wide maps: one GEMM per sample
      {{3, 3, 12, 12}, {3, 1, 3, 3}, args(1, {2, 1}, {2, 1}, 3), false},  // wide depthwise, dilated
  };
  for (const auto& c : cases) {
    check_against_naive(c, DType::f64, 1e-10);
    check_against_naive(c, DType::f32, 1e-4);
  }
}

TEST(Conv2d, LargeBatchUsesThreadsAndChunksCorrectly) {
  // Big enough to take the multi-worker path and more than one chunk.
  // f64 pins the indexing down exactly; f32 sums of 40960 products only need rounding slack.
  check_against_naive({{40, 16, 32, 32}, {4, 16, 3, 3}, {1, 1, 1, 1}, true}, DType::f64, 1e-10);
  check_against_naive({{40, 16, 32, 32}, {4, 16, 3, 3}, {1, 1, 1, 1}, true}, DType::f32, 1e-3);
}

TEST(Conv2d, ChannelsLastAndHalfInputs) {
  Tensor x = randn({2, 3, 6, 5}), w = randn({4, 3, 3, 3}), b = randn({4});
  Tensor ref = k::conv2d_forward(x, w, b, {});
  // An NHWC tensor seen through an NCHW permutation.
  Tensor nhwc = raw::contiguous(raw::permute(x, {0, 2, 3, 1}));
  Tensor cl = raw::permute(nhwc, {0, 3, 1, 2});
  ASSERT_FALSE(cl.is_contiguous());
  expect_close(k::conv2d_forward(cl, w, b, {}), ref, 1e-5);
  Tensor h = k::conv2d_forward(raw::to_dtype(x, DType::bf16), raw::to_dtype(w, DType::bf16),
                               raw::to_dtype(b, DType::bf16), {});
  EXPECT_EQ(h.dtype(), DType::bf16);
  // bf16 inputs go through f32 (exactly) and the result is rounded to bf16 once. Against the f64
  // convolution of the same rounded inputs, each output (a sum of C*kh*kw = 27 products and the
  // bias) is off by at most gamma_28(f32) * sum |terms| plus half a bf16 ulp of the value.
  Tensor x64 = rounded_f64(x, DType::bf16), w64 = rounded_f64(w, DType::bf16), b64 = rounded_f64(b, DType::bf16);
  auto abs64 = [](const Tensor& t) { return k::unary(k::Unary::Abs, t); };
  Tensor ref16 = k::conv2d_forward(x64, w64, b64, {});
  Tensor mag = k::conv2d_forward(abs64(x64), abs64(w64), abs64(b64), {});
  EXPECT_TRUE(within(h, ref16, dot_bound(ref16, mag, 3 * 9 + 1, DType::f32, DType::bf16)));
  EXPECT_EQ(vals(k::conv2d_backward_bias(ones({2, 4, 3, 3}))), (std::vector<double>{18, 18, 18, 18}));
}

TEST(Conv2d, OutputSize) {
  EXPECT_EQ(k::conv_output_size(28, 3, 1, 1, 1), 28);
  EXPECT_EQ(k::conv_output_size(7, 3, 2, 0, 1), 3);
  EXPECT_EQ(k::conv_output_size(5, 3, 1, 0, 3), -1);  // dilated kernel 7 > 5
  EXPECT_EQ(k::conv_output_size(5, 2, 2, 0, 1, false), 2);
  EXPECT_EQ(k::conv_output_size(5, 2, 2, 0, 1, true), 3);
  EXPECT_EQ(k::conv_output_size(4, 2, 2, 1, 1, true), 3);  // last window would start in the right padding: dropped
}

TEST(Conv2d, BadInput) {
  Tensor x = randn({2, 3, 5, 5});
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 4, 3, 3}), Tensor(), {}), ShapeError,
                  "conv2d: input has 3 channels but weight expects 4 (groups=1)");
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 3, 3}), Tensor(), {}), ShapeError, "conv2d: weight must be 4-D");
  EXPECT_MG_ERROR(k::conv2d_forward(randn({3, 5, 5}), randn({2, 3, 3, 3}), Tensor(), {}), ShapeError,
                  "conv2d: expected a 4-D input");
  k::Conv2dArgs g2;
  g2.groups = 2;
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 1, 3, 3}), Tensor(), g2), ValueError,
                  "conv2d: groups=2 must divide the input channels (3)");
  EXPECT_MG_ERROR(k::conv2d_forward(randn({2, 4, 5, 5}), randn({3, 2, 3, 3}), Tensor(), g2), ValueError,
                  "must divide the output channels");
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 3, 7, 7}), Tensor(), {}), ShapeError,
                  "conv2d: kernel 7x7 (dilation 1, effective 7x7) is larger than the padded input 5x5");
  k::Conv2dArgs neg;
  neg.padding = Int2(-1, 0);
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 3, 3, 3}), Tensor(), neg), ValueError,
                  "conv2d: padding must be non-negative, got (-1, 0)");
  k::Conv2dArgs s0;
  s0.stride = 0;
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 3, 3, 3}), Tensor(), s0), ValueError, "stride must be positive");
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 3, 3, 3}), randn({3}), {}), ShapeError,
                  "conv2d: bias shape [3] should be [2]");
  EXPECT_MG_ERROR(k::conv2d_forward(x, randn({2, 3, 3, 3}, {DType::f64}), Tensor(), {}), DTypeError,
                  "conv2d: weight dtype f64 differs");
  EXPECT_MG_ERROR(k::conv2d_forward(zeros({1, 3, 4, 4}, {DType::i64}), zeros({1, 3, 3, 3}, {DType::i64}), Tensor(), {}),
                  DTypeError, "conv2d: input must be floating");
  EXPECT_MG_ERROR(k::conv2d_backward_input(randn({2, 2, 4, 4}), randn({2, 3, 3, 3}), {2, 3, 5, 5}, {}), ShapeError,
                  "conv2d_backward_input: grad_output shape [2, 2, 4, 4] should be [2, 2, 3, 3]");
}

// ---------------- pooling ----------------

k::Pool2dArgs pool(Int2 kernel, Int2 stride, Int2 padding = 0, Int2 dilation = 1, bool ceil = false,
                   bool include_pad = true) {
  k::Pool2dArgs a;
  a.kernel = kernel, a.stride = stride, a.padding = padding, a.dilation = dilation;
  a.ceil_mode = ceil, a.count_include_pad = include_pad;
  return a;
}

TEST(MaxPool2d, ValuesIndicesAndBackward) {
  Tensor x = T({1, 5, 2, 0, 3, 4, 8, 1, 9, 7, 6, 2, 0, 1, 3, 11}, {1, 1, 4, 4});
  auto [y, idx] = k::max_pool2d(x, pool(2, 2));
  expect_near(y, {5, 8, 9, 11});
  EXPECT_EQ(vals(idx), (std::vector<double>{1, 6, 8, 15}));
  // Overlapping windows (kernel 3, stride 1): the max 9 at index 8 wins two windows, so its grad accumulates.
  auto [yo, io] = k::max_pool2d(x, pool(3, 1));
  expect_near(yo, {9, 8, 9, 11});
  Tensor gx = k::max_pool2d_backward(ones(yo.sizes()), io, x.sizes());
  std::vector<double> want(16, 0.0);
  want[8] = 2, want[6] = 1, want[15] = 1;
  expect_near(gx, want);
  // Padding never wins (it is -inf), even against negative inputs.
  auto [yp, ip] = k::max_pool2d(kernels::mul_scalar(ones({1, 1, 2, 2}), -3.0), pool(2, 1, 1));
  expect_near(yp, std::vector<double>(9, -3.0));
  // NaN propagates.
  auto [yn, in] = k::max_pool2d(T({1, NAN, 2, 3}, {1, 1, 2, 2}), pool(2, 2));
  EXPECT_TRUE(std::isnan(vals(yn)[0]));
  EXPECT_EQ(vals(in)[0], 1);
}

TEST(MaxPool2d, DilationAndCeilMode) {
  Tensor x = raw::view(arange(0, 25, 1, {DType::f64}), {1, 1, 5, 5});
  auto [y, i] = k::max_pool2d(x, pool(2, 1, 0, 2));  // reads (r, c), (r, c+2), (r+2, c), (r+2, c+2)
  EXPECT_EQ(y.sizes(), (Shape{1, 1, 3, 3}));
  expect_near(y, {12, 13, 14, 17, 18, 19, 22, 23, 24});
  auto [yc, ic] = k::max_pool2d(x, pool(2, 2, 0, 1, true));  // ceil: a partial last window
  EXPECT_EQ(yc.sizes(), (Shape{1, 1, 3, 3}));
  expect_near(yc, {6, 8, 9, 16, 18, 19, 21, 23, 24});
  // Dilation can make a window skip the whole input: its max is -inf, and it passes no gradient.
  auto [ye, ie] = k::max_pool2d(ones({1, 1, 1, 1}), pool(2, 1, 1, 2));
  expect_near(ye, {-INFINITY});
  expect_near(k::max_pool2d_backward(ones({1, 1, 1, 1}), ie, {1, 1, 1, 1}), {0});
}

TEST(AvgPool2d, PaddingDivisorAndBackward) {
  Tensor x = T({1, 2, 3, 4}, {1, 1, 2, 2});
  expect_near(k::avg_pool2d(x, pool(2, 2)), {2.5});
  // Padding 1, kernel 2, stride 2: each window holds one input element.
  expect_near(k::avg_pool2d(x, pool(2, 2, 1)), {0.25, 0.5, 0.75, 1.0});
  expect_near(k::avg_pool2d(x, pool(2, 2, 1, 1, false, false)), {1, 2, 3, 4});
  // Overlapping: kernel 2 stride 1 on 3x3; every interior element is in 4 windows.
  Tensor g = k::avg_pool2d_backward(ones({1, 1, 2, 2}), {1, 1, 3, 3}, pool(2, 1));
  expect_near(g, {0.25, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.5, 0.25});
  EXPECT_MG_ERROR(k::avg_pool2d(x, pool(2, 2, 0, 2)), ValueError, "avg_pool2d: dilation is not supported");
}

TEST(AdaptiveAvgPool2d, NonDivisibleWindows) {
  // 5 -> 3: windows [0,2), [1,4), [3,5) (overlapping at 1 and 3).
  Tensor x = T({1, 2, 3, 4, 5}, {1, 1, 1, 5});
  expect_near(k::adaptive_avg_pool2d(x, {1, 3}), {1.5, 3, 4.5});
  Tensor g = k::adaptive_avg_pool2d_backward(ones({1, 1, 1, 3}), {1, 1, 1, 5});
  expect_near(g, {0.5, 0.5 + 1.0 / 3, 1.0 / 3, 0.5 + 1.0 / 3, 0.5});
  // Upsampling (output larger than input) and global pooling.
  expect_near(k::adaptive_avg_pool2d(T({1, 2}, {1, 1, 1, 2}), {1, 4}), {1, 1, 2, 2});
  Tensor r = randn({2, 3, 4, 5}, {DType::f64});
  expect_close(k::adaptive_avg_pool2d(r, 1), raw::view(k::mean(r, {2, 3}), {2, 3, 1, 1}), 1e-12);
}

TEST(Pool2d, BadInput) {
  Tensor x = randn({1, 2, 4, 4});
  EXPECT_MG_ERROR(k::max_pool2d(x, pool(3, 1, 2)), ValueError,
                  "max_pool2d: padding 2 should be at most half of the (effective) kernel size 3x3");
  EXPECT_MG_ERROR(k::max_pool2d(x, pool(5, 1)), ShapeError,
                  "max_pool2d: kernel 5x5 is larger than the padded input 4x4");
  EXPECT_MG_ERROR(k::max_pool2d(x, pool(2, 0)), ValueError, "max_pool2d: stride must be positive");
  EXPECT_MG_ERROR(k::avg_pool2d(x, pool(2, 2, Int2(-1, 0))), ValueError, "avg_pool2d: padding must be non-negative");
  EXPECT_MG_ERROR(k::max_pool2d(randn({2, 4, 4}), pool(2, 2)), ShapeError, "max_pool2d: expected a 4-D input");
  EXPECT_MG_ERROR(k::adaptive_avg_pool2d(x, {0, 2}), ValueError, "adaptive_avg_pool2d: output_size must be positive");
}

// ---------------- batch norm ----------------

TEST(BatchNorm, TrainingValuesAndRunningStats) {
  // Channel 0 holds {1, 3, 5, 7}, channel 1 holds {2, 2, 2, 2}; N=2, S=2.
  Tensor x = T({1, 3, 2, 2, 5, 7, 2, 2}, {2, 2, 2});
  Tensor w = T({2, 1}, {2}), b = T({0.5, -1}, {2});
  Tensor rm = zeros({2}), rv = ones({2});
  const uint32_t v0 = rm.version();
  auto [out, mean, invstd] = k::batch_norm_forward_training(x, w, b, rm, rv, 0.1, 1e-5);
  expect_near(mean, {4, 2});
  const double is0 = 1 / std::sqrt(5.0 + 1e-5), is1 = 1 / std::sqrt(1e-5);
  expect_near(invstd, {is0, is1}, 1e-4);
  expect_near(out, {2 * -3 * is0 + 0.5, 2 * -1 * is0 + 0.5, -1, -1, 2 * 1 * is0 + 0.5, 2 * 3 * is0 + 0.5, -1, -1},
              1e-4);
  // Running stats: momentum 0.1, unbiased variance (5 * 4/3 for channel 0, 0 for channel 1).
  expect_near(rm, {0.4, 0.2});
  expect_near(rv, {0.9 + 0.1 * 20.0 / 3, 0.9});
  EXPECT_GT(rm.version(), v0);
  // No running stats and no affine also work.
  auto [o2, m2, i2] = k::batch_norm_forward_training(x, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, 1e-5);
  expect_near(m2, {4, 2});
}

TEST(BatchNorm, EvalUsesRunningStats) {
  Tensor x = T({1, 2, 3, 4}, {2, 2, 1, 1});
  Tensor out = k::batch_norm_forward_eval(x, T({1, 2}, {2}), T({0, 1}, {2}), T({1, 2}, {2}), T({4, 1}, {2}), 0.0);
  expect_near(out, {0, 1 + 2 * 0, 1, 1 + 2 * 2});
}

TEST(BatchNorm, BackwardMatchesFormula) {
  // Eval backward: dx = g * w * invstd; dw = sum(g * xhat); db = sum(g).
  Tensor x = T({1, 2, 3, 4}, {2, 2}, DType::f64), g = T({1, 1, 2, 3}, {2, 2}, DType::f64);
  auto [gx, gw, gb] = k::batch_norm_backward(g, x, T({2, 3}, {2}, DType::f64), T({0, 1}, {2}, DType::f64),
                                             T({1, 0.5}, {2}, DType::f64), false);
  expect_near(gx, {2, 1.5, 4, 4.5});
  expect_near(gw, {1 * 1 + 2 * 3, (1 * 1 + 3 * 3) * 0.5});
  expect_near(gb, {3, 4});
  // Training backward: the gradient of a constant upstream grad is zero for x.
  auto [o, m, is] = k::batch_norm_forward_training(x, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, 1e-5);
  auto [gx2, gw2, gb2] = k::batch_norm_backward(ones({2, 2}, {DType::f64}), x, Tensor(), m, is, true);
  expect_near(gx2, {0, 0, 0, 0}, 1e-9);
}

TEST(BatchNorm, BadInput) {
  EXPECT_MG_ERROR(k::batch_norm_forward_training(randn({1, 3}), Tensor(), Tensor(), zeros({3}), ones({3}), 0.1, 1e-5),
                  ValueError,
                  "batch_norm: expected more than 1 value per channel when training, got input of shape [1, 3]");
  EXPECT_MG_ERROR(k::batch_norm_forward_training(randn({4, 3}), ones({2}), Tensor(), Tensor(), Tensor(), 0.1, 1e-5),
                  ShapeError, "batch_norm: weight shape [2] should be [3]");
  EXPECT_MG_ERROR(k::batch_norm_forward_eval(randn({4, 3}), Tensor(), Tensor(), Tensor(), Tensor(), 1e-5), ValueError,
                  "batch_norm: running_mean and running_var are required");
  EXPECT_MG_ERROR(k::batch_norm_forward_eval(randn({4}), Tensor(), Tensor(), zeros({4}), ones({4}), 1e-5), ShapeError,
                  "batch_norm: expected an input of shape [N, C, *]");
  EXPECT_MG_ERROR(
      k::batch_norm_forward_training(randn({4, 3}), ones({3}, {DType::f64}), Tensor(), Tensor(), Tensor(), 0.1, 1e-5),
      DTypeError, "batch_norm: weight dtype f64 differs");
  // Per-channel tensors of two dtypes; f32 ones beside an f64 input (only half inputs on CUDA
  // take f32 per-channel tensors).
  EXPECT_MG_ERROR(k::batch_norm_forward_training(randn({4, 3}), ones({3}), Tensor(), zeros({3}, {DType::f64}),
                                                 ones({3}, {DType::f64}), 0.1, 1e-5),
                  DTypeError, "batch_norm: running_mean dtype f64 differs from weight's f32");
  EXPECT_MG_ERROR(
      k::batch_norm_forward_training(randn({4, 3}, {DType::f64}), ones({3}), Tensor(), Tensor(), Tensor(), 0.1, 1e-5),
      DTypeError, "batch_norm: weight dtype f32 differs from the input's f64");
  // The fused ReLU's backward: relu_out is a training forward's output, of the input's shape.
  Tensor x = randn({4, 3}), m = zeros({3}), is = ones({3});
  EXPECT_MG_ERROR(k::batch_norm_backward(randn({4, 3}), x, Tensor(), m, is, true, randn({4, 2})), ValueError,
                  "batch_norm_backward: relu_out must be the training forward's output, of the input's shape [4, 3]");
  EXPECT_MG_ERROR(k::batch_norm_backward(randn({4, 3}), x, Tensor(), m, is, /*training=*/false, randn({4, 3})),
                  ValueError, "batch_norm_backward: relu_out must be the training forward's output");
}

}  // namespace
}  // namespace mg
