// memory::HostParams: a GPT whose Linear parameters live in host memory (their optimizer stepping
// them on the CPU during backward, the device reading their bf16 casts) trains as the GPT with
// every parameter on the device, with and without gradient accumulation; the host update is the
// device's within a few ulps; a checkpoint of the offloaded run resumes it bit-identically, or
// in the device-resident mode within those ulps; what bad input says. The training cases need a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "autograd/functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "memory/host_params.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/state_by_name.h"
#include "serialize/serialize.h"
#include "serialize/training_checkpoint.h"
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
  const HostOptimizerFactory sgd = [](std::vector<Tensor> ps) {
    return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.05});
  };
  EXPECT_NE(testing::error_of([&] { HostParams(gpt_linear_params(m), Device::cpu(), sgd); }).find("a CUDA device"),
            std::string::npos);
  // The blocks' Linear weights and biases: 4 Linears a block (qkv, projection, MLP in and out).
  EXPECT_EQ(gpt_linear_params(m).size(), 2u * 4u * 2u);
  EXPECT_NE(testing::error_of([&] { gpt_linear_params(m, 3); }).find("first_block must be in [0, 2], got 3"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { gpt_linear_params(m, -1); }).find("got -1"), std::string::npos);
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor f64 = nn::parameter(randn({4, 4}, {DType::f64}));  // a CPU parameter qualifies; an f64 one does not
  EXPECT_NE(testing::error_of([&] { HostParams({f64}, Device::cuda(0), sgd); }).find("params[0] must be"),
            std::string::npos);
  Tensor w = nn::parameter(randn({4, 4}, {DType::f32, Device::cuda(0)}));
  EXPECT_NE(testing::error_of([&] {
              HostParams({w, w}, Device::cuda(0), sgd);
            }).find("listed twice"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { HostParams({w}, Device::cuda(0), nullptr); }).find("no optimizer factory"),
            std::string::npos);
}

// Partial offload: the last blocks' Linear parameters, in the order the full list has them.
TEST(HostParams, LastBlocksLinearParamsAreTheFullListsTail) {
  nn::GPT m(tiny());
  const std::vector<Tensor> all = gpt_linear_params(m), last = gpt_linear_params(m, 1), none = gpt_linear_params(m, 2);
  ASSERT_EQ(last.size(), 4u * 2u);
  for (size_t i = 0; i < last.size(); ++i) EXPECT_TRUE(last[i].is_same(all[all.size() - last.size() + i]));
  EXPECT_TRUE(none.empty());
}

// The plan's model by hand: 4 blocks, forward 10 ms, backward 40 (10 a block), a block's host
// update 15 ms, its casts' copy 2 ms, step at most 1.3 x 50 = 65 ms. The worker ends the j-th
// block offloaded at max(end of the one before, 10 j) + 15: 25, 40, 55, 70 ms into backward; the
// step is the forward plus the later of backward and that end + 2: 50, 52, 67, 82 ms.
TEST(HostParams, PlanOffloadsTheMostBlocksWithinTheRatio) {
  HostBlocksInput in;
  in.n_layer = 4, in.forward_ms = 10, in.backward_ms = 40, in.block_update_ms = 15, in.block_copy_ms = 2;
  const HostBlocksPlan plan = plan_host_param_blocks(in);
  EXPECT_EQ(plan.blocks, 2);
  EXPECT_DOUBLE_EQ(plan.resident_ms, 50.0);
  EXPECT_DOUBLE_EQ(plan.predicted_ms, 52.0);
  const std::vector<double> want = {50, 50, 52, 67, 82};
  ASSERT_EQ(plan.step_ms.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(plan.step_ms[i], want[i]) << i << " blocks";
  in.max_step_ratio = 1.0;  // no slower than resident: only the block whose update hides entirely
  EXPECT_EQ(plan_host_param_blocks(in).blocks, 1);
  in.max_step_ratio = 2.0;  // 82 <= 100: every block
  EXPECT_EQ(plan_host_param_blocks(in).blocks, 4);
  in.block_update_ms = 0, in.block_copy_ms = 0;  // a free update hides behind any backward
  in.max_step_ratio = 1.0;
  EXPECT_EQ(plan_host_param_blocks(in).blocks, 4);
  in.max_step_ratio = 0.9;
  EXPECT_NE(testing::error_of([&] { plan_host_param_blocks(in); }).find("max_step_ratio must be >= 1, got 0.9"),
            std::string::npos);
  // Casts on first use: the next forward reaches block 4 - j at 40 + 10 (4 - j) / 4 ms after
  // backward's start, when the j-th block's cast must be there (27, 42, 57, 72 ms): the step
  // waits 0, 0, 14.5 and 32 ms past the resident 50.
  in.max_step_ratio = 1.3, in.block_update_ms = 15, in.block_copy_ms = 2, in.casts_on_first_use = true;
  const HostBlocksPlan lazy = plan_host_param_blocks(in);
  const std::vector<double> want_lazy = {50, 50, 50, 64.5, 82};
  ASSERT_EQ(lazy.step_ms.size(), want_lazy.size());
  for (size_t i = 0; i < want_lazy.size(); ++i) EXPECT_DOUBLE_EQ(lazy.step_ms[i], want_lazy[i]) << i << " blocks";
  EXPECT_EQ(lazy.blocks, 3);
  in.casts_on_first_use = false, in.backward_ms = 0;
  EXPECT_NE(testing::error_of([&] { plan_host_param_blocks(in); }).find("backward 0 ms"), std::string::npos);
  in.backward_ms = 40, in.n_layer = 0;
  EXPECT_NE(testing::error_of([&] { plan_host_param_blocks(in); }).find("n_layer must be >= 1, got 0"),
            std::string::npos);
}

// The calibration runs the factory's optimizer on the host as the worker would: the update
// writes the cast, the master moves, and the time is positive.
// The timed search on a step that grows by 15 ms a block past 6 blocks, against a resident step
// of 100 ms and a ratio of 1.3 (130 ms: 8 blocks at most). From above the answer it bisects down;
// from below it doubles up, then bisects; from 0 (no model count) it bisects all the way.
TEST(HostParams, SearchFindsTheMostBlocksWithinTheRatio) {
  const auto step = [](int64_t n) { return 100.0 + 15.0 * static_cast<double>(std::max<int64_t>(0, n - 6)); };
  using Trials = std::vector<std::pair<int64_t, double>>;
  HostBlocksSearch s = search_host_param_blocks(36, 12, 100.0, 1.3, step);
  EXPECT_EQ(s.blocks, 8);
  EXPECT_EQ(s.trials, (Trials{{12, 190}, {6, 100}, {9, 145}, {7, 115}, {8, 130}}));
  s = search_host_param_blocks(36, 3, 100.0, 1.3, step);
  EXPECT_EQ(s.blocks, 8);
  EXPECT_EQ(s.trials, (Trials{{3, 100}, {4, 100}, {6, 100}, {10, 160}, {8, 130}, {9, 145}}));
  s = search_host_param_blocks(36, 0, 100.0, 1.3, step);
  EXPECT_EQ(s.blocks, 0);
  EXPECT_TRUE(s.trials.empty());
  // Every count within: the search ends at n_layer.
  s = search_host_param_blocks(5, 2, 100.0, 1.3, step);
  EXPECT_EQ(s.blocks, 5);
  EXPECT_EQ(s.trials, (Trials{{2, 100}, {3, 100}, {5, 100}}));
  EXPECT_NE(testing::error_of([&] { search_host_param_blocks(36, 37, 100.0, 1.3, step); })
                .find("search_host_param_blocks: need n_layer >= 1 and 0 <= first <= n_layer, got n_layer 36 and "
                      "first 37"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { search_host_param_blocks(36, 4, 100.0, 0.9, step); }).find("max_step_ratio >= 1"),
            std::string::npos);
  EXPECT_NE(
      testing::error_of([&] { search_host_param_blocks(36, 4, 100.0, 1.3, nullptr); }).find("no step timing function"),
      std::string::npos);
}

// The measure of the update inside a HostParams refuses bad input before it touches a device.
TEST(HostParams, MeasureOfTheUpdateRefusesBadInput) {
  const HostOptimizerFactory adamw = [](std::vector<Tensor> ps) {
    return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{});
  };
  // The measure inside a HostParams takes its gradients from a CUDA device, and shapes to measure.
  const std::vector<Tensor> like{zeros({4, 4})};
  EXPECT_NE(testing::error_of([&] {
              measure_host_params_update_ms(like, Device::cpu(), adamw);
            }).find("measure_host_params_update_ms: the gradients come from a CUDA device, got cpu"),
            std::string::npos);
  EXPECT_NE(
      testing::error_of([&] { measure_host_params_update_ms({}, Device::cuda(0), adamw); }).find("no parameter shapes"),
      std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              measure_host_params_update_ms(like, Device::cuda(0), nullptr);
            }).find("measure_host_params_update_ms: no optimizer factory"),
            std::string::npos);
}

// The update as a HostParams runs it: one round's worker time for a few shapes, each round after
// the first one that creates the state; and reset_stats() zeroes what the rounds counted.
TEST(HostParams, MeasuresTheUpdateInsideHostParams) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const HostOptimizerFactory adamw = [](std::vector<Tensor> ps) {
    return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{});
  };
  const std::vector<Tensor> like{zeros({256, 1024}), zeros({1024})};
  const double ms = measure_host_params_update_ms(like, Device::cuda(0), adamw, 2);
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(ms, 1e4);  // a finite time: 263K elements take well under a second
  EXPECT_NE(testing::error_of([&] {
              measure_host_params_update_ms(like, Device::cuda(0), adamw, 0);
            }).find("repeats must be >= 1, got 0"),
            std::string::npos);

  Tensor p = full({64}, 0.5, TensorOptions(DType::f32, Device::cuda(0), /*rg=*/true));
  HostParams hp({p}, Device::cuda(0), adamw);
  hp.start_round();
  hp.add_gradient(0, full({64}, 1e-3, TensorOptions(DType::f32, Device::cuda(0))));
  hp.wait();
  EXPECT_EQ(hp.stats().updates, 1);
  EXPECT_EQ(hp.stats().gradients, 1);
  hp.reset_stats();
  EXPECT_EQ(hp.stats().updates, 0);
  EXPECT_EQ(hp.stats().gradients, 0);
  EXPECT_EQ(hp.stats().update_ms, 0.0);
}

// 20 steps under bf16 autocast, B=4, T=16, from one seed and one data stream: every parameter
// on the device, or the Linear parameters in host memory. The forward reads the same bf16 casts
// of the same f32 masters and the gradients are the same GEMMs (the host receives the f32
// gradient the device's AccumulateGrad would hold); the update differs only in its rounding (the
// CPU loop contracts no multiply-add, the CUDA kernel does). With SGD the update is linear in the
// gradient, so those ulps stay ulps: where one moves a weight across a bf16 rounding boundary,
// the next forwards see one bf16 ulp (2^-8 relative) of that weight changed, which moves the
// gradients by far less than the steps. Bound: every parameter within 1e-4 of the device run's
// (the runs move them by ~1e-2), every loss within 1e-4 relative. With AdamW the update divides
// by sqrt(v): an element whose gradient is near zero can flip the sign of its step on an ulp, so
// that run checks that every host parameter trained and the loss on one repeated batch fell
// (`same_batch`: every step sees the first step's batch). `micro` > 1 splits each
// batch in `micro` micro-batches of B/micro whose gradients add up before the step (on the host
// with set_step(false), in .grad on the device), each loss divided by `micro`.
std::vector<std::vector<float>> train(bool host, bool adamw, std::vector<double>* losses,
                                      std::vector<std::vector<float>>* host_init = nullptr, int micro = 1,
                                      bool same_batch = false, int64_t first_block = 0, bool on_first_use = false) {
  const Device dev = Device::cuda(0);
  manual_seed(0);
  auto m = std::make_shared<nn::GPT>(tiny(), TensorOptions(DType::f32, dev));
  auto make = [adamw](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    if (adamw) return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions());
    return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.05});
  };
  std::unique_ptr<HostParams> hp;
  if (host) {
    hp = std::make_unique<HostParams>(gpt_linear_params(*m, first_block), dev, make);
    hp->set_casts_on_first_use(on_first_use);
    hp->provide_casts();
    for (const Tensor& p : hp->params()) {
      EXPECT_FALSE(p.is_cuda());
      if (host_init) host_init->push_back(p.to_vector<float>());
    }
  }
  std::unique_ptr<optim::Optimizer> opt = make(hp ? hp->others(m->parameters()) : m->parameters());
  manual_seed(1);
  const Tensor idx0 = randint(0, 97, {4, 16}, {DType::i64, dev}), tgt0 = randint(0, 97, {4, 16}, {DType::i64, dev});
  for (int s = 0; s < 20; ++s) {
    const Tensor idx = s == 0 || same_batch ? idx0 : randint(0, 97, {4, 16}, {DType::i64, dev});
    const Tensor tgt = s == 0 || same_batch ? tgt0 : randint(0, 97, {4, 16}, {DType::i64, dev});
    opt->zero_grad();
    double total = 0;
    for (int k = 0; k < micro; ++k) {
      const int64_t rows = 4 / micro;
      Tensor loss;
      {
        Autocast ac(DeviceType::CUDA, DType::bf16);
        loss = m->forward_loss(idx.narrow(0, k * rows, rows), tgt.narrow(0, k * rows, rows));
        if (micro > 1) loss = loss / static_cast<double>(micro);
      }
      if (hp) hp->set_step(k == micro - 1);
      loss.backward();
      if (hp && k < micro - 1) hp->provide_casts();  // the weights are unchanged: the same casts again
      total += loss.item<double>();
    }
    opt->step();
    if (hp) hp->provide_casts();
    losses->push_back(total);
  }
  // With casts on first use the last provide_casts() waited for no update: the masters are read
  // once every update has run.
  if (hp) hp->wait();
  std::vector<std::vector<float>> out;
  for (const Tensor& p : (hp ? hp->params() : m->parameters())) out.push_back(p.to_vector<float>());
  if (hp) {
    const HostParams::Stats st = hp->stats();
    EXPECT_EQ(st.updates, 20 * static_cast<int64_t>(hp->params().size()));
    EXPECT_EQ(st.gradients, 20 * micro * static_cast<int64_t>(hp->params().size()));
    // Every update's cast went to the device behind it (provide_casts() ran before the first
    // backward), and provide_casts() handed those copies over.
    EXPECT_EQ(st.casts_ahead, 20 * static_cast<int64_t>(hp->params().size()));
  }
  return out;
}

// The host run's parameters against the device run's, through the same selection (the host run
// returns its host parameters; the device run all of the model's, where the host ones are the
// blocks' Linears).
void expect_same_training(const std::vector<std::vector<float>>& all, const std::vector<std::vector<float>>& host,
                          const std::vector<double>& la, const std::vector<double>& lb, int64_t first_block = 0) {
  manual_seed(0);
  auto m = std::make_shared<nn::GPT>(tiny(), TensorOptions(DType::f32, Device::cuda(0)));
  const std::vector<Tensor> linear = gpt_linear_params(*m, first_block), params = m->parameters();
  ASSERT_EQ(host.size(), linear.size());
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

TEST(HostParams, TrainsAsTheDeviceResidentModel) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<double> la, lb;
  const auto all = train(false, false, &la);
  const auto host = train(true, false, &lb);
  expect_same_training(all, host, la, lb);
}

TEST(HostParams, PartialOffloadTrainsAsTheDeviceResidentModel) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // The last block's Linear parameters on the host, the first block's on the device with the
  // rest: the same bound as every block on the host.
  std::vector<double> la, lb, lc, ld;
  const auto all = train(false, false, &la);
  const auto host = train(true, false, &lb, nullptr, 1, false, /*first_block=*/1);
  expect_same_training(all, host, la, lb, 1);
  // The next forward taking each cast at its first read, after its update: the same values.
  const auto lazy = train(true, false, &lc, nullptr, 1, false, 1, /*on_first_use=*/true);
  expect_same_training(all, lazy, la, lc, 1);
  const auto lazy_all = train(true, false, &ld, nullptr, 1, false, 0, true);
  expect_same_training(all, lazy_all, la, ld);
}

TEST(HostParams, AccumulatesOnTheHostAsTheDeviceDoes) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // Two micro-batches a step: the device adds the second gradient to .grad, the host to its f32
  // sum; both then step with the same f32 total.
  std::vector<double> la, lb;
  const auto all = train(false, false, &la, nullptr, 2);
  const auto host = train(true, false, &lb, nullptr, 2);
  expect_same_training(all, host, la, lb);
}

// One AdamW step on the host's loop and on the device's fused kernel from the same state and
// gradient. Every operand of the update (the decayed weight, the step) is at most
// max(|p_old|, |p_new|) + |p_old - p_new| <= 3 max(|p_old|, |p_new|) in magnitude, and the two
// orders of the same f32 operations (with and without FMA contraction) differ by a few roundings
// of those operands; so the results agree within 8 ulps of max(|p_old|, |p_new|).
TEST(HostParams, HostUpdateIsTheDevicesWithinUlps) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  manual_seed(3);
  const Tensor init = randn({1 << 16}), grad = randn({1 << 16}) * 1e-2;
  Tensor pc = nn::parameter(init.clone()), pg = nn::parameter(init.to(Device::cuda(0)));
  optim::AdamWOptions o;
  o.lr = 1e-2;
  optim::AdamW oc({pc}, o), og({pg}, o);
  for (int s = 0; s < 3; ++s) {  // three steps: the moments away from their first-step values
    const Tensor g = grad * static_cast<double>(s + 1);
    pc.set_grad(g.clone());
    pg.set_grad(g.to(Device::cuda(0)));
    oc.step();
    og.step();
  }
  const auto a = pc.to_vector<float>(), b = pg.to_vector<float>(), p0 = init.to_vector<float>();
  double worst = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    const float mag = std::max(std::fabs(p0[j]), std::fabs(b[j]));
    const double ulp = std::nextafter(mag, INFINITY) - mag;
    worst = std::max(worst, std::fabs(double(a[j]) - b[j]) / ulp);
  }
  EXPECT_LE(worst, 8.0);
  std::printf("host vs device AdamW, 3 steps: at most %.1f ulps of max(|p_old|, |p_new|)\n", worst);
}

TEST(HostParams, EveryHostParameterTrainsUnderAdamW) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<double> losses;
  std::vector<std::vector<float>> init;
  const auto out = train(true, true, &losses, &init, 1, /*same_batch=*/true);
  ASSERT_EQ(out.size(), init.size());
  for (size_t k = 0; k < out.size(); ++k) EXPECT_NE(out[k], init[k]) << "host parameter " << k << " never moved";
  EXPECT_LT(losses.back(), losses.front());
}

// Checkpoints of the offloaded run (components "model", "optimizer": the device AdamW's,
// "host_optimizer": HostParams'). The steps after the checkpoint take synthetic gradients (drawn
// from a generator of the step's own, in the model's parameter order; the host parameters' handed
// to HostParams as their gradient sinks would), not the GPT's backward: its attention backward
// on the device accumulates in an order that changes from run to run, so two runs of it differ
// in the last bits whatever the checkpoint restores. The forward is deterministic: it checks the
// casts the resumed run reads.
const HostOptimizerFactory kAdamW = [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
  return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions());
};

void synthetic_step(nn::GPT& m, optim::Optimizer& opt, HostParams* hp, int s) {
  const Device dev = Device::cuda(0);
  Generator g(1000 + s);
  opt.zero_grad();
  for (const Tensor& p : m.parameters()) {
    Tensor grad = (randn(p.sizes(), {}, &g) * 1e-2).to(dev);
    size_t k = 0;
    const std::vector<Tensor> host = hp ? hp->params() : std::vector<Tensor>{};
    while (k < host.size() && !host[k].is_same(p)) ++k;
    if (k < host.size())
      hp->add_gradient(k, grad);
    else
      Tensor(p).set_grad(grad);
  }
  opt.step();
  if (hp) hp->provide_casts();  // waits for the host updates, starts the next round
}

// The loss on a fixed batch under bf16 autocast, no gradients: what the parameters' casts give.
float fixed_loss(nn::GPT& m) {
  const Device dev = Device::cuda(0);
  Generator data(99);
  const Tensor idx = randint(0, 97, {4, 16}, {DType::i64}, &data).to(dev);
  const Tensor tgt = randint(0, 97, {4, 16}, {DType::i64}, &data).to(dev);
  NoGradGuard ng;
  Autocast ac(DeviceType::CUDA, DType::bf16);
  return m.forward_loss(idx, tgt).item<float>();
}

// A GPT with its Linears in host memory (HostParams, AdamW there) and a device AdamW for the
// others, from `seed`, with its checkpoint's components registered.
struct OffloadRun {
  std::shared_ptr<nn::GPT> model;
  std::unique_ptr<HostParams> hp;
  std::unique_ptr<optim::AdamW> opt;
  serialize::TrainingCheckpoint ckpt;
  explicit OffloadRun(uint64_t seed) {
    manual_seed(seed);
    model = std::make_shared<nn::GPT>(tiny(), TensorOptions(DType::f32, Device::cuda(0)));
    hp = std::make_unique<HostParams>(gpt_linear_params(*model), Device::cuda(0), kAdamW);
    opt = std::make_unique<optim::AdamW>(hp->others(model->parameters()), optim::AdamWOptions());
    ckpt.add("model", *model).add("optimizer", *opt).add("host_optimizer", *hp);
  }
  void train(int first, int steps) {
    for (int s = first; s < first + steps; ++s) {
      synthetic_step(*model, *opt, hp.get(), s);
      ++ckpt.step;
    }
  }
};

std::string temp_path(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::filesystem::path d =
      std::filesystem::path(t ? t : "/tmp") / ("host_params_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return (d / name).string();
}

std::vector<std::vector<float>> values(nn::GPT& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

constexpr int kSaveAt = 4, kMore = 3;

// The uninterrupted run: kSaveAt steps, the checkpoint at `path` (and the fixed batch's loss
// then), kMore steps; the parameters after each of those (after[0]: one step past the checkpoint).
struct Uninterrupted {
  float loss_at_save = 0;
  std::vector<std::vector<std::vector<float>>> after;
};
Uninterrupted uninterrupted(const std::string& path) {
  OffloadRun run(0);
  run.hp->provide_casts();
  run.train(0, kSaveAt);
  run.ckpt.save(path);
  Uninterrupted u;
  u.loss_at_save = fixed_loss(*run.model);
  for (int s = kSaveAt; s < kSaveAt + kMore; ++s) {
    run.train(s, 1);
    u.after.push_back(values(*run.model));
  }
  return u;
}

// A fresh model (other initial values) and a fresh HostParams load the checkpoint: the forward
// gives the saved run's loss bit for bit (the casts HostParams was built with were of the other
// values; provide_casts() writes them again from the loaded masters, whose version changed), and
// the same kMore steps give the same bits (masters, moments and step counts restored exactly).
TEST(HostParams, CheckpointResumesBitIdentically) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string path = temp_path("offload.ckpt");
  const Uninterrupted u = uninterrupted(path);

  OffloadRun resumed(7);
  resumed.ckpt.load(path);
  EXPECT_EQ(resumed.ckpt.step, kSaveAt);
  for (const Tensor& p : resumed.hp->params()) {
    ASSERT_NE(resumed.hp->optimizer().state(p), nullptr);
    EXPECT_EQ(resumed.hp->optimizer().state(p)->step, kSaveAt);
  }
  resumed.hp->provide_casts();  // after the load: the next region reads the loaded values' casts
  EXPECT_EQ(fixed_loss(*resumed.model), u.loss_at_save);
  resumed.train(kSaveAt, kMore);
  const auto got = values(*resumed.model);
  const auto names = resumed.model->named_parameters();
  ASSERT_EQ(got.size(), u.after.back().size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), u.after.back()[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), u.after.back()[i].data(), got[i].size() * sizeof(float)), 0)
        << names[i].first << " differs from the uninterrupted run";
  }
}

// The offloaded checkpoint resumed in the device-resident mode: one AdamW over every parameter
// on the device loads the device and host optimizers' states merged by name. Its first step
// applies the same update to the same values with the same gradient, which for the host
// parameters the CUDA kernel now computes instead of the host loop: within
// HostUpdateIsTheDevicesWithinUlps' bound, 8 ulps of max(|p_old|, |p_new|).
TEST(HostParams, CheckpointResumesInResidentModeWithinUlps) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string path = temp_path("offload_to_resident.ckpt");
  const Uninterrupted u = uninterrupted(path);

  const StateDict sd = serialize::load(path);
  manual_seed(7);
  nn::GPT m(tiny(), TensorOptions(DType::f32, Device::cuda(0)));
  m.load_state_dict(sd.sub("model"));
  const auto named = m.named_parameters();
  std::vector<Tensor> linear = gpt_linear_params(m), rest;
  for (const Tensor& p : m.parameters())
    if (std::none_of(linear.begin(), linear.end(), [&](const Tensor& l) { return l.is_same(p); })) rest.push_back(p);
  optim::AdamW one(m.parameters(), optim::AdamWOptions());
  // The saved parts' names: the device optimizer stepped the others in the model's order (HostParams::
  // others), the host optimizer the blocks' Linears in gpt_linear_params' order.
  one.load_state_dict(optim::merge_state_dicts({{sd.sub("optimizer"), optim::param_names(rest, named)},
                                                {sd.sub("host_optimizer"), optim::param_names(linear, named)}},
                                               optim::named_state(one, named)));
  for (const Tensor& p : m.parameters()) {
    ASSERT_NE(one.state(p), nullptr);
    EXPECT_EQ(one.state(p)->step, kSaveAt);
  }
  const auto before = values(m);
  synthetic_step(m, one, nullptr, kSaveAt);
  const auto got = values(m);
  ASSERT_EQ(got.size(), u.after[0].size());
  double worst_ulps = 0, worst_abs = 0;
  std::string worst_name;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), u.after[0][i].size());
    for (size_t j = 0; j < got[i].size(); ++j) {
      const float mag = std::max(std::fabs(before[i][j]), std::fabs(u.after[0][i][j]));
      const double ulp = std::nextafter(mag, INFINITY) - mag, diff = std::fabs(double(got[i][j]) - u.after[0][i][j]);
      worst_abs = std::max(worst_abs, diff);
      if (diff / ulp > worst_ulps) worst_ulps = diff / ulp, worst_name = named[i].first;
    }
  }
  EXPECT_LE(worst_ulps, 8.0) << "at " << worst_name;
  std::printf(
      "offloaded checkpoint resumed resident, one step: largest difference %.3g (%.1f ulps of "
      "max(|p_old|, |p_new|), %s)\n",
      worst_abs, worst_ulps, worst_name.empty() ? "none" : worst_name.c_str());
}

}  // namespace
}  // namespace mg::memory
