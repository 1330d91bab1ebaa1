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
#include "optim/sgd.h"
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

// 20 steps under bf16 autocast, B=4, T=16, from one seed and one data stream: every parameter
// on the device, or the Linear parameters in host memory. The forward reads the same bf16 casts
// of the same f32 masters and the gradients are the same GEMMs; the update differs only in its
// rounding (the CPU loop contracts no multiply-add, the CUDA kernel does). With SGD the update is
// linear in the gradient, so those ulps stay ulps: where one moves a weight across a bf16
// rounding boundary, the next forwards see one bf16 ulp (2^-8 relative) of that weight changed,
// which moves the gradients by far less than the steps. Bound: every parameter within 1e-4 of
// the device run's (the runs move them by ~1e-2), every loss within 1e-4 relative. With AdamW the
// update divides by sqrt(v): an element whose gradient is near zero can flip the sign of its step
// on an ulp, so that run only checks that every host parameter trained (its gradient came home).
std::vector<std::vector<float>> train(bool host, bool adamw, std::vector<double>* losses,
                                      std::vector<std::vector<float>>* host_init = nullptr) {
  const Device dev = Device::cuda(0);
  manual_seed(0);
  auto m = std::make_shared<nn::GPT>(tiny(), TensorOptions(DType::f32, dev));
  std::unique_ptr<HostParams> hp;
  if (host) {
    hp = std::make_unique<HostParams>(gpt_linear_params(*m), dev);
    hp->provide_casts();
    for (const Tensor& p : hp->params()) {
      EXPECT_FALSE(p.is_cuda());
      if (host_init) host_init->push_back(p.to_vector<float>());
    }
  }
  std::unique_ptr<optim::Optimizer> opt;
  if (adamw)
    opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions());
  else
    opt = std::make_unique<optim::SGD>(m->parameters(), optim::SGDOptions{.lr = 0.05});
  manual_seed(1);
  for (int s = 0; s < 20; ++s) {
    const Tensor idx = randint(0, 97, {4, 16}, {DType::i64, dev}), tgt = randint(0, 97, {4, 16}, {DType::i64, dev});
    opt->zero_grad();
    Tensor loss;
    {
      Autocast ac(DeviceType::CUDA, DType::bf16);
      loss = m->forward_loss(idx, tgt);
    }
    loss.backward();
    opt->step();
    if (hp) hp->provide_casts();
    losses->push_back(loss.item<double>());
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& p : (hp ? hp->params() : m->parameters())) out.push_back(p.to_vector<float>());
  return out;
}

TEST(HostParams, TrainsAsTheDeviceResidentModel) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<double> la, lb;
  manual_seed(0);
  nn::GPT probe(tiny(), {}, nullptr, false);
  const size_t n_host = gpt_linear_params(probe).size();
  const auto all = train(false, false, &la);
  const auto host = train(true, false, &lb);
  // The host run returns its host parameters; the device run all of the model's, in the model's
  // order, where the host ones are the blocks' Linears: compare those through the same selection.
  ASSERT_EQ(host.size(), n_host);
  manual_seed(0);
  auto m = std::make_shared<nn::GPT>(tiny(), TensorOptions(DType::f32, Device::cuda(0)));
  const std::vector<Tensor> linear = gpt_linear_params(*m), params = m->parameters();
  size_t k = 0;
  for (size_t i = 0; i < params.size() && k < linear.size(); ++i) {
    if (!params[i].is_same(linear[k])) continue;
    ASSERT_EQ(all[i].size(), host[k].size());
    for (size_t j = 0; j < host[k].size(); ++j)
      ASSERT_NEAR(all[i][j], host[k][j], 1e-4) << "host parameter " << k << " element " << j;
    ++k;
  }
  EXPECT_EQ(k, linear.size());
  for (size_t s = 0; s < la.size(); ++s) EXPECT_NEAR(la[s], lb[s], 1e-4 * std::fabs(la[s])) << "step " << s;
}

TEST(HostParams, EveryHostParameterTrainsUnderAdamW) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<double> losses;
  std::vector<std::vector<float>> init;
  const auto out = train(true, true, &losses, &init);
  ASSERT_EQ(out.size(), init.size());
  for (size_t k = 0; k < out.size(); ++k) EXPECT_NE(out[k], init[k]) << "host parameter " << k << " never moved";
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace
}  // namespace mg::memory
