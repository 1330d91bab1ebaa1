// Bad input across families: device mismatches, CUDA tensors without CUDA kernels,
// undefined tensors. Each raises the right mg::Error subclass naming the op.
#include "tests/kernels/test_util.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

// A tensor that claims to live on cuda:0 (no memory behind it): only the dispatch looks at it.
Tensor fake_cuda(const Shape& shape) {
  auto st = std::make_shared<StorageImpl>();
  st->device = Device::cuda(0);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = DType::f32;
  impl->version = std::make_shared<uint32_t>(0);
  return Tensor(impl);
}

TEST(Errors, DifferentDevices) {
  Tensor c = zeros({2, 2}), g = fake_cuda({2, 2});
  EXPECT_MG_ERROR(k::add(c, g), DeviceError, "add: tensors on different devices cpu and cuda:0");
  EXPECT_MG_ERROR(k::matmul(c, g), DeviceError, "matmul");
  EXPECT_MG_ERROR(k::where(zeros({2, 2}, {DType::b8}), c, g), DeviceError, "where");
  EXPECT_MG_ERROR(k::cat({c, g}, 0), DeviceError, "cat");
  EXPECT_MG_ERROR(k::gather(c, 0, fake_cuda({1, 1})), DeviceError, "gather");
  EXPECT_MG_ERROR(k::linear(c, c, fake_cuda({2})), DeviceError, "linear");
}

TEST(Errors, CudaKernelsNotAvailable) {
  if (k::has_backend(Device::cuda(0))) GTEST_SKIP() << "this build has CUDA kernels";
  Tensor g = fake_cuda({2, 2});
  EXPECT_MG_ERROR(k::unary(k::Unary::Exp, g), DeviceError, "exp: CUDA kernels not available in this build");
  EXPECT_MG_ERROR(k::add(g, g), DeviceError, "add: CUDA kernels not available");
  EXPECT_MG_ERROR(k::sum(g), DeviceError, "sum: CUDA kernels not available");
  EXPECT_MG_ERROR(k::softmax(g, 1), DeviceError, "softmax");
  EXPECT_MG_ERROR(k::matmul(g, g), DeviceError, "matmul");
  EXPECT_MG_ERROR(k::has_nonfinite(g), DeviceError, "has_nonfinite");
  EXPECT_MG_ERROR(k::fill_(g, 1), DeviceError, "fill_");
  EXPECT_MG_ERROR(k::copy_(zeros({2, 2}), g), DeviceError, "copy_");
  EXPECT_MG_ERROR(k::nll_loss_forward(g, fake_cuda({2})), DeviceError, "nll_loss_forward");
}

TEST(Errors, UndefinedTensors) {
  EXPECT_MG_ERROR(k::add(Tensor(), zeros({1})), ValueError, "add");
  EXPECT_MG_ERROR(k::unary(k::Unary::Relu, Tensor()), ValueError, "relu");
  EXPECT_MG_ERROR(k::sum(Tensor()), ValueError, "sum");
  EXPECT_MG_ERROR(k::copy_(zeros({1}), Tensor()), ValueError, "copy_");
  EXPECT_NO_THROW(k::linear(zeros({1, 2}), zeros({3, 2}), Tensor()));
}

TEST(Errors, ShapesNamedInMessages) {
  EXPECT_MG_ERROR(k::add(zeros({2, 3}), zeros({4})), ShapeError, "add: shapes [2, 3] and [4] cannot be broadcast");
  EXPECT_MG_ERROR(k::binary(k::Binary::Lt, zeros({2}), zeros({3})), ShapeError, "lt");
  EXPECT_MG_ERROR(k::axpby(zeros({2}), 1, zeros({3}), 1), ShapeError, "axpby");
}

// The residual add's bias (a branch's Linear bias, kernels::add_layer_norm_forward) needs the
// branch and the normalized shape.
TEST(Errors, AddLayerNormResidualBias) {
  Tensor x = zeros({2, 4}), r = zeros({2, 4});
  EXPECT_MG_ERROR(k::add_layer_norm_forward(x, Tensor(), {4}, Tensor(), Tensor(), 1e-5, DType::f32, zeros({4})),
                  ValueError, "add_layer_norm: a residual bias (shape [4]) needs a residual, got none");
  EXPECT_MG_ERROR(k::add_layer_norm_forward(x, r, {4}, Tensor(), Tensor(), 1e-5, DType::f32, zeros({3})), ShapeError,
                  "add_layer_norm: residual_bias has shape [3], expected normalized_shape [4]");
  EXPECT_MG_ERROR(k::add_layer_norm_forward(x, r, {4}, Tensor(), Tensor(), 1e-5, DType::f32, zeros({4}, {DType::i64})),
                  DTypeError, "add_layer_norm: residual_bias must be floating, got i64");
  EXPECT_MG_ERROR(k::add_layer_norm_forward(x, r, {4}, Tensor(), Tensor(), 1e-5, DType::f32, fake_cuda({4})),
                  DeviceError, "add_layer_norm");
}

TEST(Errors, FailedOpsLeaveInputsUnchanged) {
  Tensor a = T({1, 2}, {2});
  uint32_t v = a.version();
  EXPECT_THROW(k::binary_(k::Binary::Add, a, zeros({3})), ShapeError);
  EXPECT_THROW(k::scatter_(a, 0, T({5}, {1}, DType::i64), T({9}, {1})), IndexError);
  EXPECT_EQ(a.version(), v);
  expect_near(a, {1, 2});
}

}  // namespace
}  // namespace mg
