// Channels-last on the CPU: core's layout API (MemoryFormat, is_contiguous(fmt), is_dense,
// suggest_memory_format, contiguous(fmt), empty(..., fmt)), elementwise results that keep an
// NHWC operand's layout, casts that keep it, the differentiable layout change, the CPU ops
// that read NHWC inputs (NCHW results), and Module::set_memory_format. The CUDA kernels that
// run NHWC are tests/kernels/cuda/nn_parity_test.cc's.
#include <gtest/gtest.h>

#include <vector>

#include "autograd/conv_functions.h"
#include "autograd/functions.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "nn/conv.h"
#include "nn/sequential.h"

namespace mg {
namespace {

const MemoryFormat kCL = MemoryFormat::ChannelsLast;

// The values of t in logical [N, C, H, W] order, whatever its strides.
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

TEST(MemoryFormat, ChannelsLastStridesAndPredicates) {
  EXPECT_EQ(channels_last_strides({2, 3, 4, 5}), (Shape{60, 1, 15, 3}));
  Tensor t = empty({2, 3, 4, 5}, {DType::f32}, kCL);
  EXPECT_EQ(t.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(t.is_contiguous(kCL));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.is_dense());
  EXPECT_TRUE(is_channels_last(t));
  EXPECT_EQ(suggest_memory_format(t), kCL);
  // C == 1 or H = W = 1: the NHWC strides are NCHW ones too, and count as contiguous.
  for (const Shape& s : {Shape{2, 1, 4, 5}, Shape{2, 6, 1, 1}}) {
    Tensor u = empty(s, {DType::f32}, kCL);
    EXPECT_TRUE(u.is_contiguous() && u.is_contiguous(kCL)) << shape_str(s);
    EXPECT_EQ(suggest_memory_format(u), MemoryFormat::Contiguous) << shape_str(s);
  }
  // Not dense: a slice, an expanded tensor.
  Tensor c = zeros({2, 3, 4, 5});
  EXPECT_FALSE(raw::slice(c, 3, 0, 5, 2).is_dense());
  EXPECT_FALSE(raw::expand(zeros({1, 3, 1, 1}), {2, 3, 4, 5}).is_dense());
  EXPECT_TRUE(raw::transpose(c, 0, 3).is_dense());  // any permutation of a dense tensor
  EXPECT_FALSE(zeros({3, 4, 5}).is_contiguous(kCL));
}

TEST(MemoryFormat, ChannelsLastNeedsFourDims) {
  EXPECT_THROW(empty({3, 4, 5}, {DType::f32}, kCL), ShapeError);
  EXPECT_THROW(zeros({3, 4}).contiguous(kCL), ShapeError);
  EXPECT_THROW(channels_last_strides({2, 3, 4, 5, 6}), ShapeError);
}

TEST(MemoryFormat, ContiguousConvertsAndKeepsValues) {
  Generator g(3);
  Tensor x = uniform({2, 3, 4, 5}, -1, 1, {DType::f32}, &g);
  Tensor cl = x.contiguous(kCL);
  EXPECT_TRUE(is_channels_last(cl));
  EXPECT_EQ(values(cl), values(x));
  EXPECT_TRUE(cl.contiguous(kCL).is_same(cl));  // already: the same tensor
  Tensor back = cl.contiguous();
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_EQ(values(back), values(x));
  // Casts keep the layout (autocast's casts of an NHWC activation stay NHWC).
  Tensor h = raw::to_dtype(cl, DType::f64);
  EXPECT_TRUE(is_channels_last(h));
  EXPECT_EQ(values(h), values(x));
}

TEST(MemoryFormat, ElementwiseResultsKeepChannelsLast) {
  Generator g(4);
  Tensor a = uniform({2, 3, 4, 5}, -1, 1, {DType::f32}, &g), b = uniform({2, 3, 4, 5}, -1, 1, {DType::f32}, &g);
  Tensor acl = a.contiguous(kCL), bcl = b.contiguous(kCL);
  // Both NHWC, one NHWC, a broadcast per-channel operand: the result is NHWC, values the same.
  for (const auto& [x, y] : std::vector<std::pair<Tensor, Tensor>>{{acl, bcl}, {acl, b}, {a, bcl}}) {
    Tensor s = kernels::binary(kernels::Binary::Add, x, y);
    EXPECT_TRUE(is_channels_last(s));
    EXPECT_EQ(values(s), values(kernels::binary(kernels::Binary::Add, a, b)));
  }
  Tensor bias = uniform({1, 3, 1, 1}, -1, 1, {DType::f32}, &g);
  Tensor sb = kernels::binary(kernels::Binary::Mul, acl, bias);
  EXPECT_TRUE(is_channels_last(sb));
  EXPECT_EQ(values(sb), values(kernels::binary(kernels::Binary::Mul, a, bias)));
  Tensor r = kernels::unary(kernels::Unary::Relu, acl);
  EXPECT_TRUE(is_channels_last(r));
  EXPECT_EQ(values(r), values(kernels::unary(kernels::Unary::Relu, a)));
  // Both contiguous: contiguous, as before.
  EXPECT_TRUE(kernels::binary(kernels::Binary::Add, a, b).is_contiguous());
  // In place on an NHWC tensor stays NHWC.
  Tensor c = acl.contiguous(kCL);
  kernels::unary_(kernels::Unary::Relu, c);
  EXPECT_TRUE(is_channels_last(c));
  EXPECT_EQ(values(c), values(r));
}

TEST(MemoryFormat, LayoutChangeIsDifferentiable) {
  Generator g(5);
  Tensor x = uniform({2, 3, 4, 5}, -1, 1, {DType::f64}, &g);
  x.requires_grad_(true);
  Tensor w = uniform({2, 3, 4, 5}, -1, 1, {DType::f64}, &g);
  Tensor y = x.contiguous(kCL);
  EXPECT_TRUE(y.requires_grad());
  sum(mul(relu(y), w)).backward();
  // d/dx sum(relu(x) * w) = w where x > 0.
  const std::vector<double> xv = values(x), wv = values(w), gv = values(x.grad());
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(gv[i], xv[i] > 0 ? wv[i] : 0.0) << i;
}

TEST(MemoryFormat, CpuLayersReadChannelsLastInputs) {
  // The CPU kernels are NCHW: an NHWC input gives the NCHW op's values.
  Generator g(6);
  Tensor x = uniform({2, 4, 9, 7}, -1, 1, {DType::f32}, &g), w = uniform({5, 4, 3, 3}, -1, 1, {DType::f32}, &g);
  Tensor xcl = x.contiguous(kCL);
  EXPECT_EQ(values(conv2d(xcl, w, Tensor(), 1, 1)), values(conv2d(x, w, Tensor(), 1, 1)));
  EXPECT_EQ(values(max_pool2d(xcl, 3, 2, 1)), values(max_pool2d(x, 3, 2, 1)));
  EXPECT_EQ(values(adaptive_avg_pool2d(xcl, Int2(1))), values(adaptive_avg_pool2d(x, Int2(1))));
  Tensor rm = zeros({4}), rv = ones({4});
  EXPECT_EQ(values(batch_norm(xcl, rm, rv, Tensor(), Tensor(), true)),
            values(batch_norm(x, zeros({4}), ones({4}), Tensor(), Tensor(), true)));
}

TEST(MemoryFormat, ModuleSetsItsConvolutions) {
  auto seq = std::make_shared<nn::Sequential>();
  auto c1 = std::make_shared<nn::Conv2d>(3, 4, 3);
  auto c2 = std::make_shared<nn::Conv2d>(4, 4, 1);
  seq->push_back(c1);
  seq->push_back(c2);
  EXPECT_EQ(c1->memory_format, MemoryFormat::Contiguous);
  seq->set_memory_format(kCL);
  EXPECT_EQ(c1->memory_format, kCL);
  EXPECT_EQ(c2->memory_format, kCL);
  EXPECT_NE(c1->extra_repr().find("memory_format=channels_last"), std::string::npos) << c1->extra_repr();
  // Parameters keep their NCHW layout.
  EXPECT_TRUE(c1->weight.is_contiguous());
  // On the CPU the forward is the NCHW one.
  Tensor x = randn({1, 3, 8, 8});
  EXPECT_EQ(values((*seq)(x)), values((*c2)((*c1)(x))));
  seq->set_memory_format(MemoryFormat::Contiguous);
  EXPECT_EQ(c2->memory_format, MemoryFormat::Contiguous);
}

}  // namespace
}  // namespace mg
