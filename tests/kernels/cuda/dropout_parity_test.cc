// The fused bias + dropout + residual on CUDA (kernels/cuda/elementwise.cu) against the CPU
// kernel: both compute each element's number from the same Philox block as bernoulli_, so from
// one generator state the masks are the same bits, and so are the values (one dtype or an f32
// stream with a half branch; the products are never contracted into FMAs). Inside a CUDA graph
// each replay draws fresh masks, those eager execution would draw. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/captured_step.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using namespace mg::testing;  // to_cuda, host, dstr, the CudaTest skip fixture

class CudaDropoutParity : public CudaTest {
 protected:
  Generator data{20261205};
};

Tensor to_cpu(const Tensor& t) { return raw::to_device(t, Device::cpu()); }

// The first differing element of two same-shaped tensors, by bits; -1 when identical.
int64_t first_difference(const Tensor& a, const Tensor& b) {
  const Tensor ca = to_cpu(a).contiguous(), cb = to_cpu(b).contiguous();
  const size_t es = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(ca.raw_data());
  const auto* pb = static_cast<const unsigned char*>(cb.raw_data());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0) return i;
  return -1;
}

struct Case {
  Shape shape;
  DType branch, stream;  // stream: x's and out's dtype
};

// [64, 768] and [3, 2, 12] take the vector path; [5, 7] (a row not a multiple of 4, a partial
// last Philox block) the scalar one.
TEST_F(CudaDropoutParity, MasksValuesAndGradientsAreTheCpuKernelsBits) {
  std::vector<Case> cases;
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
    for (Shape s : {Shape{64, 768}, Shape{5, 7}, Shape{3, 2, 12}}) cases.push_back({s, dt, dt});
  for (DType half : {DType::f16, DType::bf16}) cases.push_back({{64, 768}, half, DType::f32});
  for (const Case& c : cases) {
    for (bool with_x : {false, true}) {
      for (bool with_bias : {false, true}) {
        const std::string what = dstr(c.branch) + " stream " + dstr(c.stream) + " " + shape_str(c.shape) +
                                 " x=" + std::to_string(with_x) + " bias=" + std::to_string(with_bias);
        Tensor x = with_x ? host(c.shape, c.stream, data) : Tensor();
        Tensor b = host(c.shape, c.branch, data);
        Tensor bias = with_bias ? host({c.shape.back()}, c.branch, data) : Tensor();
        const double p = 0.35;
        Generator gc(99), gg(99);
        (void)uniform({5}, 0, 1, {DType::f32}, &gc);  // start mid-stream, on both
        (void)uniform({5}, 0, 1, {DType::f32}, &gg);
        auto [out_c, keep_c] = k::bias_dropout_add(x, b, bias, p, &gc);
        auto [out_g, keep_g] = k::bias_dropout_add(to_cuda(x), to_cuda(b), to_cuda(bias), p, &gg);
        EXPECT_EQ(first_difference(keep_g, keep_c), -1) << "mask, " << what;
        EXPECT_EQ(first_difference(out_g, out_c), -1) << "values, " << what;
        EXPECT_EQ(gg.get_state().offset, gc.get_state().offset) << what;
        Tensor gr = host(c.shape, out_c.dtype(), data);
        EXPECT_EQ(first_difference(k::dropout_backward(to_cuda(gr), keep_g, p, c.branch),
                                   k::dropout_backward(gr, keep_c, p, c.branch)),
                  -1)
            << "gradient, " << what;
      }
    }
  }
}

// Misaligned views (an offset of one element) take the scalar path with the same bits.
TEST_F(CudaDropoutParity, UnalignedOperandsGiveTheSameBits) {
  Tensor big = host({1 + 16 * 32}, DType::bf16, data);
  Tensor b = big.narrow(0, 1, 16 * 32).reshape({16, 32});  // contiguous, 2 bytes past alignment
  Generator gc(4), gg(4);
  auto [out_c, keep_c] = k::bias_dropout_add(Tensor(), b, Tensor(), 0.5, &gc);
  auto [out_g, keep_g] =
      k::bias_dropout_add(Tensor(), to_cuda(big).narrow(0, 1, 16 * 32).reshape({16, 32}), Tensor(), 0.5, &gg);
  EXPECT_EQ(first_difference(keep_g, keep_c), -1);
  EXPECT_EQ(first_difference(out_g, out_c), -1);
}

// A captured bias_dropout_add draws a fresh mask at each replay: the one an eager call would
// draw from the generator's state at that replay.
TEST_F(CudaDropoutParity, CapturedReplaysDrawWhatEagerWould) {
  Tensor b = to_cuda(host({32, 64}, DType::bf16, data)), x = to_cuda(host({32, 64}, DType::f32, data)),
         bias = to_cuda(host({64}, DType::bf16, data));
  Tensor out, keep;
  CapturedStep step([&] { std::tie(out, keep) = k::bias_dropout_add(x, b, bias, 0.25); }, /*warmup=*/1);
  std::vector<Tensor> masks;
  for (int r = 0; r < 3; ++r) {
    const PhiloxState st = default_generator().get_state();
    step.replay();
    Generator eager;
    eager.set_state(st);
    auto [out_e, keep_e] = k::bias_dropout_add(x, b, bias, 0.25, &eager);
    EXPECT_EQ(first_difference(keep, keep_e), -1) << "replay " << r;
    EXPECT_EQ(first_difference(out, out_e), -1) << "replay " << r;
    EXPECT_EQ(default_generator().get_state().offset, eager.get_state().offset) << "replay " << r;
    masks.push_back(to_cpu(keep));
  }
  EXPECT_NE(first_difference(masks[0], masks[1]), -1) << "two replays drew the same mask";
}

}  // namespace
}  // namespace mg
