// CUDA vs CPU parity for the layer kernels (kernels/conv.h, pool.h, norm.h)
// beyond the op table's rows (tests/autograd/op_table_nn.cc, which runs conv2d, the poolings,
// batch norm and layer norm through autograd on the device): cuDNN with channels-last
// operands, benchmark mode and its cache, max-pool indices, batch norm's saved and running
// statistics, layer norm's statistics and masked backward, in f32 (rtol 1e-4), f16 (1e-2),
// bf16 (2e-2) and f64, on fresh random inputs of odd sizes. The CPU reference runs in f32 (f64 for f64) on the very
// values the GPU sees (half inputs are rounded first), so only the GPU's own error is measured. Then the autograd ops
// (mg::conv2d, ...) run a small CNN and a layer norm on CUDA tensors, gradients compared.
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/conv_functions.h"
#include "autograd/functions.h"
#include "autograd/transformer_functions.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cuda/reference.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/ops.h"
#include "nn/models/resnet.h"
#include "tests/autograd/gradcheck.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using namespace mg::testing;  // to_cuda, host, dstr, CudaTest

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};

double tol_of(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-9;
    case DType::f32:
      return 1e-4;
    case DType::f16:
      return 1e-2;
    default:
      return 2e-2;  // bf16
  }
}

// The dtype the CPU reference computes in for GPU dtype `t`.
DType ref_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The CPU reference's copy of a GPU input: the same (already rounded) values, in ref dtype.
Tensor ref(const Tensor& t) { return t.defined() ? raw::to_dtype(t, ref_dtype(t.dtype())) : t; }

// The shared helper (tests/autograd/gradcheck.h); dtypes may differ (the reference is f32
// for half inputs).
void expect_parity(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  ASSERT_TRUE(gpu.defined() && gpu.is_cuda()) << what;
  EXPECT_TRUE(parity(cpu, gpu, tol)) << what;
}

void expect_equal_i64(const Tensor& cpu, const Tensor& gpu, const std::string& what) {
  ASSERT_EQ(cpu.sizes(), gpu.sizes()) << what;
  std::vector<int64_t> a = cpu.to_vector<int64_t>(), b = gpu.to_vector<int64_t>();
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i)
    if (a[i] != b[i]) ++bad, ADD_FAILURE() << what << ": index " << i << ": cpu " << a[i] << " vs cuda " << b[i];
}

// x on the device, channels-last when nhwc and 4-D (the NHWC kernels' input).
Tensor on_device(const Tensor& t, bool nhwc) {
  Tensor d = to_cuda(t);
  return nhwc && d.defined() && d.dim() == 4 ? raw::contiguous(d, MemoryFormat::ChannelsLast) : d;
}

class NnParity : public CudaTest {
 protected:
  Generator g{20241129};
};

// ---------------------------------------------------------------- convolution

struct ConvCase {
  std::string name;
  Shape x, w;  // [N, C, H, W], [O, C/groups, kH, kW]
  k::Conv2dArgs args;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  auto A = [](Int2 s, Int2 p, Int2 d, int64_t gr) {
    k::Conv2dArgs a;
    a.stride = s, a.padding = p, a.dilation = d, a.groups = gr;
    return a;
  };
  return {
      {"3x3 pad1 bias", {2, 3, 11, 13}, {5, 3, 3, 3}, A(1, 1, 1, 1), true},
      {"3x5 stride2 pad(1,2)", {3, 4, 17, 10}, {6, 4, 3, 5}, A(2, Int2(1, 2), 1, 1), false},
      {"dilation2 groups2", {2, 6, 15, 14}, {4, 3, 3, 3}, A(1, 2, 2, 2), true},
      {"depthwise x2", {2, 8, 9, 9}, {16, 1, 3, 3}, A(1, 1, 1, 8), true},
      {"depthwise stride2", {3, 5, 12, 7}, {5, 1, 5, 5}, A(2, 2, 1, 5), false},
      {"1x1", {4, 7, 5, 5}, {9, 7, 1, 1}, A(1, 0, 1, 1), true},
      {"mixed stride/dilation groups3", {2, 9, 16, 13}, {6, 3, 3, 2}, A(Int2(2, 3), Int2(2, 1), Int2(2, 1), 3), true},
      {"batch1 7x7 stride2", {1, 3, 23, 19}, {8, 3, 7, 7}, A(2, 3, 1, 1), true},
      // MobileNet's depthwise 3x3 at its sizes: channels-last runs memgrad's NHWC kernels, the
      // weight gradient over 3136 (and 900) positions in several chunks.
      {"depthwise 3x3 (MobileNet)", {4, 64, 28, 28}, {64, 1, 3, 3}, A(1, 1, 1, 64), false},
      {"depthwise 3x3 stride2 (MobileNet)", {4, 32, 29, 30}, {32, 1, 3, 3}, A(2, 1, 1, 32), false},
  };
}

// Forward, both backwards and the bias gradient of one case, GPU (dtype dt) vs CPU.
void check_conv(Generator& g, const ConvCase& c, DType dt, bool channels_last_x = false) {
  const std::string what = "conv " + c.name + " " + dstr(dt) + (channels_last_x ? " NHWC" : "");
  Tensor x = host(c.x, dt, g), w = host(c.w, dt, g, -0.5, 0.5);
  Tensor b = c.bias ? host({c.w[0]}, dt, g) : Tensor();
  Tensor gx = to_cuda(x);
  if (channels_last_x) gx = raw::permute(raw::contiguous(raw::permute(gx, {0, 2, 3, 1})), {0, 3, 1, 2});
  Tensor y_cpu = k::conv2d_forward(ref(x), ref(w), ref(b), c.args);
  Tensor y_gpu = k::conv2d_forward(gx, to_cuda(w), to_cuda(b), c.args);
  ASSERT_EQ(y_gpu.dtype(), dt) << what;
  expect_parity(y_cpu, y_gpu, tol_of(dt), what + " forward");

  Tensor gy = host(y_cpu.sizes(), dt, g);
  Tensor ggy = to_cuda(gy);
  if (channels_last_x) ggy = raw::permute(raw::contiguous(raw::permute(ggy, {0, 2, 3, 1})), {0, 3, 1, 2});
  expect_parity(k::conv2d_backward_input(ref(gy), ref(w), c.x, c.args),
                k::conv2d_backward_input(ggy, to_cuda(w), c.x, c.args), tol_of(dt), what + " backward_input");
  expect_parity(k::conv2d_backward_weight(ref(gy), ref(x), c.w, c.args),
                k::conv2d_backward_weight(ggy, gx, c.w, c.args), tol_of(dt), what + " backward_weight");
  if (c.bias)
    expect_parity(k::conv2d_backward_bias(ref(gy)), k::conv2d_backward_bias(ggy), tol_of(dt), what + " backward_bias");
}

// conv_cases() in every dtype, forward and all three gradients, run as op-table rows
// (conv2d_3x3_pad1_bias, ...) through mg::conv2d. What stays here needs the kernel surface:
// channels-last operands, benchmark mode, the algorithm cache, an empty batch.

TEST_F(NnParity, Conv2dChannelsLastInput) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (const ConvCase& c : conv_cases()) check_conv(g, c, dt, /*channels_last_x=*/true);
}

TEST_F(NnParity, Conv2dBenchmarkModeAgrees) {
  k::cuda::set_cudnn_benchmark(true);
  for (DType dt : {DType::f32, DType::bf16})
    for (const ConvCase& c : conv_cases()) check_conv(g, c, dt);
  k::cuda::set_cudnn_benchmark(false);
}

TEST_F(NnParity, Conv2dRepeatedShapeUsesCacheAndStaysExact) {
  // The same shape twice (the second call takes the cached algorithm) with fresh data.
  const ConvCase c = conv_cases()[0];
  for (int rep = 0; rep < 3; ++rep) check_conv(g, c, DType::f32);
}

TEST_F(NnParity, Conv2dEmptyBatch) {
  Tensor x = empty({0, 3, 8, 8}, {DType::f32, Device::cuda(0)});
  Tensor w = to_cuda(host({4, 3, 3, 3}, DType::f32, g));
  k::Conv2dArgs a;
  a.padding = 1;
  Tensor y = k::conv2d_forward(x, w, Tensor(), a);
  EXPECT_EQ(y.sizes(), (Shape{0, 4, 8, 8}));
  Tensor gw = k::conv2d_backward_weight(empty({0, 4, 8, 8}, {DType::f32, Device::cuda(0)}), x, {4, 3, 3, 3}, a);
  for (double v : gw.to_vector<double>()) ASSERT_EQ(v, 0.0);
}

// ---------------------------------------------------------------- pooling

struct PoolCase {
  std::string name;
  Shape x;
  k::Pool2dArgs args;
};

std::vector<PoolCase> pool_cases(bool with_dilation) {
  auto P = [](Int2 kk, Int2 s, Int2 p, Int2 d, bool ceil, bool cip) {
    k::Pool2dArgs a;
    a.kernel = kk, a.stride = s, a.padding = p, a.dilation = d, a.ceil_mode = ceil, a.count_include_pad = cip;
    return a;
  };
  std::vector<PoolCase> v = {
      {"k2 s2", {2, 3, 10, 14}, P(2, 2, 0, 1, false, true)},
      {"k3 s2 p1", {2, 5, 15, 13}, P(3, 2, 1, 1, false, true)},
      {"k3 s2 p1 ceil", {3, 2, 15, 12}, P(3, 2, 1, 1, true, true)},
      {"k3 s1 p1 no-pad-count", {1, 4, 9, 11}, P(3, 1, 1, 1, false, false)},
      {"k(2,4) s(1,3) p(1,2) ceil no-pad-count", {2, 3, 11, 17}, P(Int2(2, 4), Int2(1, 3), Int2(1, 2), 1, true, false)},
      {"k5 s3 p2", {2, 3, 16, 16}, P(5, 3, 2, 1, false, true)},
  };
  if (with_dilation) {
    v.push_back({"k3 s2 d2 p2", {2, 3, 15, 13}, P(3, 2, 2, 2, false, true)});
    v.push_back({"k3 s1 d(1,3) p1 ceil", {2, 3, 12, 14}, P(3, 1, 1, Int2(1, 3), true, true)});
  }
  return v;
}

TEST_F(NnParity, MaxPool2dForwardIndices) {
  for (DType dt : kDtypes)
    for (const PoolCase& c : pool_cases(true)) {
      const std::string what = "max_pool2d " + c.name + " " + dstr(dt);
      Tensor x = host(c.x, dt, g);
      auto [y_cpu, i_cpu] = k::max_pool2d(ref(x), c.args);
      auto [y_gpu, i_gpu] = k::max_pool2d(to_cuda(x), c.args);
      expect_parity(y_cpu, y_gpu, 0.0, what + " values");  // a max is exact
      expect_equal_i64(i_cpu, i_gpu, what + " indices");
      auto [y_inf, i_inf] = k::max_pool2d(to_cuda(x), c.args, /*return_indices=*/false);  // inference path
      EXPECT_FALSE(i_inf.defined()) << what;
      expect_parity(y_cpu, y_inf, 0.0, what + " values without indices");
      // The backward of these cases runs as op-table rows (max_pool2d_k2_s2, ...).
    }
}

TEST_F(NnParity, MaxPool2dNaNPropagates) {
  Tensor x = host({1, 1, 4, 4}, DType::f32, g);
  std::vector<float> v = x.to_vector<float>();
  v[5] = std::nanf("");
  x = from_vector(v, {1, 1, 4, 4});
  k::Pool2dArgs a;
  a.kernel = 2, a.stride = 2;
  auto [y_cpu, i_cpu] = k::max_pool2d(x, a);
  auto [y_gpu, i_gpu] = k::max_pool2d(to_cuda(x), a);
  expect_parity(y_cpu, y_gpu, 0.0, "max_pool2d NaN");
  expect_equal_i64(i_cpu, i_gpu, "max_pool2d NaN indices");
}

// Channels-last pooling (the NHWC walk of kernels/cuda/pool.cu): outputs and gradients
// channels-last, against the CPU's NCHW results. Max values and indices are exact; averages
// sum the same window in the same order; max-pool gradients add overlapping windows with
// atomics in f32 (order-dependent, hence the dtype tolerance).
TEST_F(NnParity, PoolingChannelsLast) {
  const MemoryFormat cl = MemoryFormat::ChannelsLast;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const double t = tol_of(dt);
    for (const PoolCase& c : pool_cases(true)) {
      const std::string what = "max_pool2d channels_last " + c.name + " " + dstr(dt);
      Tensor x = host(c.x, dt, g);
      auto [y_cpu, i_cpu] = k::max_pool2d(ref(x), c.args);
      auto [y_gpu, i_gpu] = k::max_pool2d(on_device(x, true), c.args);
      EXPECT_TRUE(is_channels_last(y_gpu) && is_channels_last(i_gpu)) << what;
      expect_parity(y_cpu, y_gpu, 0.0, what + " values");
      expect_equal_i64(i_cpu, i_gpu, what + " indices");
      Tensor gy = host(y_cpu.sizes(), dt, g);
      Tensor gx = k::max_pool2d_backward(on_device(gy, true), i_gpu, c.x, cl);
      EXPECT_TRUE(is_channels_last(gx)) << what;
      expect_parity(k::max_pool2d_backward(ref(gy), i_cpu, c.x), gx, t, what + " backward");
    }
    for (const PoolCase& c : pool_cases(false)) {
      const std::string what = "avg_pool2d channels_last " + c.name + " " + dstr(dt);
      Tensor x = host(c.x, dt, g);
      Tensor y_cpu = k::avg_pool2d(ref(x), c.args), y_gpu = k::avg_pool2d(on_device(x, true), c.args);
      EXPECT_TRUE(is_channels_last(y_gpu)) << what;
      expect_parity(y_cpu, y_gpu, t, what);
      Tensor gy = host(y_cpu.sizes(), dt, g);
      Tensor gx = k::avg_pool2d_backward(on_device(gy, true), c.x, c.args, cl);
      EXPECT_TRUE(is_channels_last(gx)) << what;
      expect_parity(k::avg_pool2d_backward(ref(gy), c.x, c.args), gx, t, what + " backward");
    }
    // Adaptive: ResNet's global pool (7x7 -> 1x1, whose [N, C, 1, 1] output is both layouts at
    // once) and uneven windows.
    for (auto [xs, os] : std::vector<std::pair<Shape, Int2>>{{{4, 24, 7, 7}, Int2(1)}, {{2, 5, 13, 11}, Int2(3, 5)}}) {
      const std::string what = "adaptive_avg_pool2d channels_last " + shape_str(xs) + " " + dstr(dt);
      Tensor x = host(xs, dt, g);
      Tensor y_cpu = k::adaptive_avg_pool2d(ref(x), os), y_gpu = k::adaptive_avg_pool2d(on_device(x, true), os);
      EXPECT_TRUE(y_gpu.is_contiguous(cl)) << what;
      expect_parity(y_cpu, y_gpu, t, what);
      Tensor gy = host(y_cpu.sizes(), dt, g);
      Tensor gx = k::adaptive_avg_pool2d_backward(on_device(gy, true), xs, cl);
      EXPECT_TRUE(is_channels_last(gx)) << what;
      expect_parity(k::adaptive_avg_pool2d_backward(ref(gy), xs), gx, t, what + " backward");
    }
  }
}

// avg_pool2d over pool_cases(false) and adaptive_avg_pool2d, forward and backward in every
// dtype, run as op-table rows (avg_pool2d_k2_s2, adaptive_avg_pool2d_13x11_to_3x5, ...).

// ---------------------------------------------------------------- batch norm

TEST_F(NnParity, BatchNormTrainingEvalBackward) {
  // The last shapes split each channel into several chunks (the kernels' C x P grid): 16-byte
  // vectors with even chunks, odd S with uneven chunks, and a ResNet-like half-precision shape.
  // Every 4-D shape runs NCHW and channels-last (the [M, C] column kernels); there {4, 520, 5, 3}
  // has 65 vector columns of bf16/f16 (three channel tiles, the last one partial) and
  // {2, 3, 33, 31} a channel count no vector width divides.
  const std::vector<Shape> shapes = {{4, 5, 7, 9},    {16, 7},        {3, 6, 11},      {2, 3, 33, 31},
                                     {16, 8, 32, 32}, {3, 5, 37, 41}, {8, 64, 56, 56}, {4, 520, 5, 3}};
  // A half-precision input also runs with f32 weight, bias and statistics (autocast's
  // parameters, taken as they are): pdt is the per-channel dtype.
  for (DType dt : kDtypes)
    for (DType pdt : {dt, DType::f32})
      for (const Shape& xs : shapes)
        for (bool nhwc : {false, true}) {
          if ((nhwc && xs.size() != 4) || (pdt != dt && dt != DType::f16 && dt != DType::bf16)) continue;
          for (bool affine : {true, false}) {
            const std::string what = "batch_norm " + shape_str(xs) + (affine ? " affine " : " plain ") + dstr(dt) +
                                     (nhwc ? " channels_last" : "") + (pdt != dt ? " f32 parameters" : "");
            const int64_t C = xs[1];
            Tensor x = host(xs, dt, g, -1, 3);  // mean far from 0
            // Per-channel values rounded to dt, then held in pdt.
            auto per_channel = [&](double lo, double hi) { return raw::to_dtype(host({C}, dt, g, lo, hi), pdt); };
            Tensor w = affine ? per_channel(0.5, 1.5) : Tensor(), b = affine ? per_channel(-2, 2) : Tensor();
            Tensor rm = per_channel(-0.5, 0.5), rv = per_channel(0.5, 2);
            Tensor x_g = on_device(x, nhwc);
            // Training: out, batch statistics, running statistics updated in place.
            Tensor rm_c = ref(rm), rv_c = ref(rv), rm_g = to_cuda(rm), rv_g = to_cuda(rv);
            auto [o_c, m_c, is_c] = k::batch_norm_forward_training(ref(x), ref(w), ref(b), rm_c, rv_c, 0.1, 1e-5);
            auto [o_g, m_g, is_g] = k::batch_norm_forward_training(x_g, to_cuda(w), to_cuda(b), rm_g, rv_g, 0.1, 1e-5);
            EXPECT_EQ(is_channels_last(o_g), nhwc) << what << ": the output keeps the input's layout";
            const double t = tol_of(dt);
            expect_parity(o_c, o_g, t, what + " train out");
            expect_parity(m_c, m_g, t, what + " save_mean");
            expect_parity(is_c, is_g, t, what + " save_invstd");
            expect_parity(rm_c, rm_g, t, what + " running_mean");
            expect_parity(rv_c, rv_g, t, what + " running_var");
            // Training backward with the GPU's own statistics on both sides.
            Tensor gy = host(xs, dt, g);
            EXPECT_EQ(m_g.dtype(), pdt) << what;
            Tensor m_r = raw::to_dtype(m_g.cpu(), ref_dtype(dt)), is_r = raw::to_dtype(is_g.cpu(), ref_dtype(dt));
            auto [dx_c, dw_c, db_c] = k::batch_norm_backward(ref(gy), ref(x), ref(w), m_r, is_r, true);
            auto [dx_g, dw_g, db_g] = k::batch_norm_backward(on_device(gy, nhwc), x_g, to_cuda(w), m_g, is_g, true);
            EXPECT_EQ(is_channels_last(dx_g), nhwc) << what << ": grad_x keeps the input's layout";
            expect_parity(dx_c, dx_g, t, what + " train grad_x");
            expect_parity(dw_c, dw_g, t, what + " grad_weight");
            expect_parity(db_c, db_g, t, what + " grad_bias");
            // With the ReLU (fused on the channels-last kernels): max(0, out), and a backward that
            // masks grad_out by the output. Both sides mask by the GPU's output, so a value that
            // rounds to 0 on one side only cannot move the comparison.
            if (affine) {
              auto [or_g, mr_g, isr_g] = k::batch_norm_forward_training(x_g, to_cuda(w), to_cuda(b), Tensor(), Tensor(),
                                                                        0.1, 1e-5, /*relu=*/true);
              EXPECT_EQ(is_channels_last(or_g), nhwc) << what;
              expect_parity(k::unary(k::Unary::Relu, o_c), or_g, t, what + " relu out");
              Tensor y_r = raw::to_dtype(or_g.cpu(), ref_dtype(dt));
              auto [rx_c, rw_c, rb_c] = k::batch_norm_backward(ref(gy), ref(x), ref(w), m_r, is_r, true, y_r);
              auto [rx_g, rw_g, rb_g] =
                  k::batch_norm_backward(on_device(gy, nhwc), x_g, to_cuda(w), mr_g, isr_g, true, or_g);
              expect_parity(rx_c, rx_g, t, what + " relu grad_x");
              expect_parity(rw_c, rw_g, t, what + " relu grad_weight");
              expect_parity(rb_c, rb_g, t, what + " relu grad_bias");
            }
            // Eval: running statistics as constants.
            Tensor e_g = k::batch_norm_forward_eval(x_g, to_cuda(w), to_cuda(b), to_cuda(rm), to_cuda(rv), 1e-5);
            EXPECT_EQ(is_channels_last(e_g), nhwc) << what;
            expect_parity(k::batch_norm_forward_eval(ref(x), ref(w), ref(b), ref(rm), ref(rv), 1e-5), e_g, t,
                          what + " eval out");
            Tensor inv = raw::to_dtype(k::unary(k::Unary::Rsqrt, k::add_scalar(ref(rv), 1e-5)), pdt);
            auto [ex_c, ew_c, eb_c] = k::batch_norm_backward(ref(gy), ref(x), ref(w), ref(rm), ref(inv), false);
            auto [ex_g, ew_g, eb_g] =
                k::batch_norm_backward(on_device(gy, nhwc), x_g, to_cuda(w), to_cuda(rm), to_cuda(inv), false);
            expect_parity(ex_c, ex_g, t, what + " eval grad_x");
            expect_parity(ew_c, ew_g, t, what + " eval grad_weight");
          }
        }
}

// ---------------------------------------------------------------- layer norm

struct LnCase {
  Shape x, ns;
  bool affine;
};

TEST_F(NnParity, LayerNormForwardBackward) {
  const std::vector<LnCase> cases = {
      // (Rows of 1 or 2 elements have grad_x == 0 exactly, which only rounding noise can match.)
      {{3, 5, 37}, {37}, true},  {{7, 768}, {768}, true}, {{4, 2, 3, 9}, {3, 9}, false},
      {{3, 4097}, {4097}, true}, {{1, 3}, {3}, true},     {{130, 33}, {33}, true},
  };
  for (DType dt : kDtypes)
    for (const LnCase& c : cases) {
      const std::string what = "layer_norm " + shape_str(c.x) + " " + dstr(dt);
      const double t = tol_of(dt);
      Tensor x = host(c.x, dt, g, -1, 3);
      Tensor w = c.affine ? host(c.ns, dt, g, 0.5, 1.5) : Tensor(), b = c.affine ? host(c.ns, dt, g) : Tensor();
      auto [o_c, m_c, r_c] = k::layer_norm_forward(ref(x), c.ns, ref(w), ref(b), 1e-5);
      auto [o_g, m_g, r_g] = k::layer_norm_forward(to_cuda(x), c.ns, to_cuda(w), to_cuda(b), 1e-5);
      expect_parity(o_c, o_g, t, what + " out");
      expect_parity(m_c, m_g, dt == DType::f64 ? t : 1e-5, what + " mean");  // stats are f32 for half inputs
      expect_parity(r_c, r_g, dt == DType::f64 ? t : 1e-4, what + " rstd");
      Tensor gy = host(c.x, dt, g);
      auto [dx_c, dw_c, db_c] = k::layer_norm_backward(ref(gy), ref(x), c.ns, m_c, r_c, ref(w));
      auto [dx_g, dw_g, db_g] = k::layer_norm_backward(to_cuda(gy), to_cuda(x), c.ns, m_g, r_g, to_cuda(w));
      expect_parity(dx_c, dx_g, t, what + " grad_x");
      expect_parity(dw_c, dw_g, t, what + " grad_weight");
      expect_parity(db_c, db_g, t, what + " grad_bias");
      // Masked backward: only the parameter gradients.
      auto [nx, mw, mb] =
          k::layer_norm_backward(to_cuda(gy), to_cuda(x), c.ns, m_g, r_g, to_cuda(w), {false, true, true});
      EXPECT_FALSE(nx.defined()) << what;
      expect_parity(dw_c, mw, t, what + " masked grad_weight");
    }
}

TEST_F(NnParity, LayerNormFusedMatchesReferenceKernel) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t n : {1, 31, 32, 33, 1000, 5000}) {
      const int64_t rows = 37;
      Tensor x = to_cuda(host({rows, n}, dt, g, -1, 3)), w = to_cuda(host({n}, dt, g)), b = to_cuda(host({n}, dt, g));
      const TensorOptions o{dt, Device::cuda(0)}, so{DType::f32, Device::cuda(0)};
      Tensor o1 = empty({rows, n}, o), m1 = empty({rows}, so), r1 = empty({rows}, so);
      Tensor o2 = empty({rows, n}, o), m2 = empty({rows}, so), r2 = empty({rows}, so);
      k::backend(Device::cuda(0), "layer_norm").layer_norm_forward(x, w, b, 1e-5, o1, m1, r1);
      k::cuda::layer_norm_forward_reference(x, w, b, 1e-5, o2, m2, r2);
      const std::string what = "layer_norm fused vs reference n=" + std::to_string(n) + " " + dstr(dt);
      expect_parity(o2.cpu(), o1, tol_of(dt), what + " out");
      expect_parity(m2.cpu(), m1, 1e-5, what + " mean");
      expect_parity(r2.cpu(), r1, 1e-4, what + " rstd");
    }
}

// ---------------------------------------------------------------- autograd on CUDA tensors

// A small CNN (conv -> batch norm (training) -> relu -> max pool -> depthwise conv with bias
// -> avg pool -> adaptive avg pool), then a layer norm over the features: the loss and every
// gradient on CUDA match the CPU in f32. (The first conv has no bias: batch norm would make
// its gradient exactly zero, which only rounding noise can match.)
TEST_F(NnParity, AutogradOpsRunOnCudaTensors) {
  Tensor x = host({3, 4, 19, 17}, DType::f32, g), w1 = host({8, 4, 3, 3}, DType::f32, g, -0.3, 0.3);
  Tensor gamma = host({8}, DType::f32, g, 0.5, 1.5), beta = host({8}, DType::f32, g);
  Tensor w2 = host({8, 1, 3, 3}, DType::f32, g, -0.3, 0.3), b2 = host({8}, DType::f32, g);
  Tensor lw = host({8 * 2 * 2}, DType::f32, g, 0.5, 1.5), lb = host({8 * 2 * 2}, DType::f32, g);
  struct Run {
    Tensor loss;
    std::vector<Tensor> leaves;
    Tensor rm, rv;
  };
  // channels_last: x goes NHWC first (a differentiable layout change), and every activation
  // after it must stay NHWC: the conv, batch norm, relu and pooling outputs.
  auto run = [&](Device dev, bool channels_last = false) {
    Run r;
    for (const Tensor& t : {x, w1, gamma, beta, w2, b2, lw, lb}) {
      Tensor l = raw::to_device(t, dev);
      l.requires_grad_(true);
      r.leaves.push_back(l);
    }
    r.rm = zeros({8}, {DType::f32, dev});
    r.rv = ones({8}, {DType::f32, dev});
    const auto& L = r.leaves;
    auto keeps = [&](const Tensor& t, const char* what) {
      if (channels_last) EXPECT_TRUE(is_channels_last(t)) << what << " left channels-last: " << shape_str(t.strides());
      return t;
    };
    Tensor h = conv2d(channels_last ? L[0].contiguous(MemoryFormat::ChannelsLast) : L[0], L[1], Tensor(), 1, 1);
    keeps(h, "conv2d");
    h = keeps(batch_norm(h, r.rm, r.rv, L[2], L[3], /*training=*/true), "batch_norm");
    h = keeps(max_pool2d(keeps(relu(h), "relu"), 3, 2, 1), "max_pool2d");
    h = keeps(conv2d(h, L[4], L[5], 1, 1, 1, /*groups=*/8), "depthwise conv2d");
    h = keeps(avg_pool2d(h, 2, std::nullopt, 0, /*ceil_mode=*/true), "avg_pool2d");
    h = adaptive_avg_pool2d(h, Int2(2, 2));
    h = layer_norm(h.reshape({3, 32}), {32}, L[6], L[7]);
    r.loss = sum(mul(h, h));
    r.loss.backward();
    return r;
  };
  Run c = run(Device::cpu()), gpu = run(Device::cuda(0));
  expect_parity(c.loss, gpu.loss, 1e-4, "autograd CNN loss");
  const char* names[] = {"x", "w1", "gamma", "beta", "w2", "b2", "ln weight", "ln bias"};
  for (size_t i = 0; i < c.leaves.size(); ++i) {
    ASSERT_TRUE(gpu.leaves[i].grad().defined()) << names[i];
    expect_parity(c.leaves[i].grad(), gpu.leaves[i].grad(), 1e-3, std::string("autograd CNN grad ") + names[i]);
  }
  expect_parity(c.rm, gpu.rm, 1e-4, "autograd CNN running_mean");
  expect_parity(c.rv, gpu.rv, 1e-4, "autograd CNN running_var");
  // The same network channels-last: NHWC kernels throughout, the same loss and gradients
  // (and x's gradient NCHW again, through the layout change's backward).
  Run nhwc = run(Device::cuda(0), /*channels_last=*/true);
  expect_parity(c.loss, nhwc.loss, 1e-4, "channels-last CNN loss");
  for (size_t i = 0; i < c.leaves.size(); ++i) {
    ASSERT_TRUE(nhwc.leaves[i].grad().defined()) << names[i];
    expect_parity(c.leaves[i].grad(), nhwc.leaves[i].grad(), 1e-3, std::string("channels-last CNN grad ") + names[i]);
  }
  expect_parity(c.rm, nhwc.rm, 1e-4, "channels-last CNN running_mean");
  expect_parity(c.rv, nhwc.rv, 1e-4, "channels-last CNN running_var");
}

// ResNet-18 with set_memory_format(ChannelsLast) and an NHWC input against the same weights
// NCHW, both on CUDA in f32 (TF32 off): the logits' loss and every parameter gradient agree to
// the tolerance the CNN above uses (the two layouts run different cuDNN algorithms, whose f32
// sums round differently over ~5e2-term dot products and 18 layers).
TEST_F(NnParity, ResNetChannelsLastMatchesNchw) {
  auto grads = [&](bool channels_last, Tensor* loss) {
    manual_seed(7);
    auto model = nn::resnet18(10, TensorOptions(DType::f32, Device::cuda(0)));
    model->train();
    if (channels_last) model->set_memory_format(MemoryFormat::ChannelsLast);
    Generator gx(99);
    Tensor x = to_cuda(host({4, 3, 40, 36}, DType::f32, gx));
    if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    Tensor y = from_vector(std::vector<int64_t>{1, 7, 3, 9}, {4}).to(Device::cuda(0));
    *loss = cross_entropy((*model)(x), y);
    loss->backward();
    std::vector<Tensor> g;
    for (const Tensor& p : model->parameters()) g.push_back(p.grad());
    return g;
  };
  Tensor l0, l1;
  std::vector<Tensor> g0 = grads(false, &l0), g1 = grads(true, &l1);
  expect_parity(l0.cpu(), l1, 1e-4, "resnet18 loss");
  ASSERT_EQ(g0.size(), g1.size());
  for (size_t i = 0; i < g0.size(); ++i) {
    ASSERT_TRUE(g1[i].defined()) << "parameter " << i;
    EXPECT_TRUE(g1[i].is_contiguous()) << "parameter " << i << ": gradients keep the parameters' NCHW layout";
    expect_parity(g0[i].cpu(), g1[i], 1e-3, "resnet18 grad of parameter " + std::to_string(i));
  }
}

}  // namespace
}  // namespace mg
