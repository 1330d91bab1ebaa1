// memory::HostParams: a GPT whose Linear parameters live in host memory (the optimizer stepping
// them on the CPU, the device reading their bf16 casts) trains as the GPT with every parameter
// on the device; what the device holds; and what bad input says. The training cases need a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "memory/host_params.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "tests/error_of.h"

namespace mg::memory {
namespace {

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = 97, c.block_size = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 64;
  return c;
}

TEST(HostParams, BadInputSaysWhatIsWrong) {
  nn::GPT m(tiny());
  EXPECT_NE(testing::error_of([&] { HostParams(gpt_linear_params(m), Device::cpu()); }).find("a CUDA device"),
            std::string::npos);
  // The blocks' Linear weights and biases: 4 Linears a block (qkv, projection, MLP in and out).
  EXPECT_EQ(gpt_linear_params(m).size(), 2u * 4u * 2u);
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor on_cpu = nn::parameter(randn({4, 4}));
  EXPECT_NE(testing::error_of([&] { HostParams({on_cpu}, Device::cuda(0)); }).find("params[0] must be"),
            std::string::npos);
}

// 20 AdamW steps under bf16 autocast, B=4, T=16, from one seed and one data stream: every
// parameter on the device, or the Linear parameters in host memory. The forward reads the same
// bf16 casts of the same f32 masters and the gradients are the same GEMMs, so the runs differ
// only by the update: the CPU loop rounds AdamW's sqrt in double and contracts no multiply-add,
// the CUDA kernel does both in f32 with FMAs, a few f32 ulps of a parameter per step. Where such
// an ulp moves a weight across a bf16 rounding boundary, the next forwards see a different cast,
// and that weight's later steps differ by a part of one step. Bound: every parameter within
// 0.1 lr (a tenth of one step) of the device run's, and every loss within 1e-3 of it.
TEST(HostParams, TrainsAsTheDeviceResidentModel) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  optim::AdamWOptions o;
  o.lr = 1e-3;
  auto train = [&](bool host, std::vector<double>* losses) {
    manual_seed(0);
    auto m = std::make_shared<nn::GPT>(tiny(), TensorOptions(DType::f32, dev));
    std::unique_ptr<HostParams> hp;
    if (host) {
      hp = std::make_unique<HostParams>(gpt_linear_params(*m), dev);
      hp->provide_casts();
      for (const Tensor& p : hp->params()) EXPECT_FALSE(p.is_cuda());
    }
    optim::AdamW opt(m->parameters(), o);
    manual_seed(1);
    for (int s = 0; s < 20; ++s) {
      const Tensor idx = randint(0, 97, {4, 16}, {DType::i64, dev}), tgt = randint(0, 97, {4, 16}, {DType::i64, dev});
      opt.zero_grad();
      Tensor loss;
      {
        Autocast ac(DeviceType::CUDA, DType::bf16);
        loss = m->forward_loss(idx, tgt);
      }
      loss.backward();
      opt.step();
      if (hp) hp->provide_casts();
      losses->push_back(loss.item<double>());
    }
    std::vector<std::vector<float>> out;
    for (const Tensor& p : m->parameters()) out.push_back(p.to_vector<float>());
    return out;
  };
  std::vector<double> la, lb;
  const auto a = train(false, &la), b = train(true, &lb);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      ASSERT_LE(std::fabs(a[i][j] - b[i][j]), 0.1 * o.lr) << "parameter " << i << " element " << j;
  for (size_t s = 0; s < la.size(); ++s) EXPECT_NEAR(la[s], lb[s], 1e-3) << "step " << s;
}

}  // namespace
}  // namespace mg::memory
