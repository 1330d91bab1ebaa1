// Batches that fit: gradient accumulation equals one large batch; find_max_batch_size
// (doubling then bisection) on a fake device under the caching allocator's limit, on a
// model, and on a real GPU under the per-process limit; memory-budgeted batch splitting.
#include "memory/batch_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "autograd/functions.h"
#include "autograd/recompute.h"
#include "core/allocator/caching_allocator.h"
#include "core/allocator/fake_device.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/sequential.h"

namespace mg::nn {

using namespace mg::memory;  // the module under test
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::shared_ptr<Sequential> mlp(DType dt, Device dev = Device::cpu()) {
  Generator g(7);
  auto m = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(16, 32, true, TensorOptions{dt, dev}, &g), std::make_shared<ReLU>(),
      std::make_shared<Linear>(32, 3, true, TensorOptions{dt, dev}, &g)});
  return m;
}

TEST(GradientAccumulation, EqualsOneLargeBatch) {
  auto model = mlp(DType::f64);
  Generator g(3);
  Tensor x = randn({30, 16}, {DType::f64}, &g), y = randn({30, 3}, {DType::f64}, &g);
  auto loss_fn = [&](const Tensor& a, const Tensor& b) { return mse_loss((*model)(a), b); };
  Tensor full = loss_fn(x, y);
  full.backward();
  std::vector<std::vector<double>> want;
  for (const Tensor& p : model->parameters()) want.push_back(p.grad().to_vector<double>());
  for (int64_t micro : {2, 4, 7}) {  // 7 does not divide 30: unequal micro-batches
    model->zero_grad(true);
    const double loss = accumulate_gradients(x, y, micro, loss_fn);
    EXPECT_NEAR(loss, full.item(), 1e-12);
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto got = params[i].grad().to_vector<double>();
      for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[i][k], 1e-12 * (1 + std::abs(want[i][k])));
    }
  }
  EXPECT_THROW(accumulate_gradients(x, y, 31, loss_fn), ValueError);
  EXPECT_THROW(accumulate_gradients(x, y.narrow(0, 0, 29), 2, loss_fn), ShapeError);
}

TEST(FindMaxBatchSize, FakeDeviceUnderTheAllocatorLimit) {
  // A "step" keeps a fixed 24 MiB workspace plus 3 MiB of activations per sample, with the
  // allocator capped at 1 GiB of a 2 GiB fake device.
  allocator::FakeDevice dev(2048 * MiB);
  allocator::CachingAllocator alloc(dev);
  alloc.set_memory_limit(1024 * MiB);
  auto step = [&](int64_t b) {
    std::vector<void*> live;
    try {
      live.push_back(alloc.allocate(24 * MiB));
      for (int64_t i = 0; i < b; ++i) live.push_back(alloc.allocate(3 * MiB));
    } catch (...) {
      for (void* p : live) alloc.free(p);
      throw;
    }
    for (void* p : live) alloc.free(p);
  };
  BatchSearchResult r = find_max_batch_size(step);
  ASSERT_GT(r.max_batch, 100);
  EXPECT_NO_THROW(step(r.max_batch));
  EXPECT_THROW(step(r.max_batch + 1), OutOfMemoryError);
  // Doubling then bisection: about 2 log2(max) tries, not a linear walk.
  EXPECT_LE(static_cast<double>(r.tries.size()), 2 * std::log2(static_cast<double>(r.max_batch)) + 3);
  // The allocator stayed consistent through every OOM: nothing allocated, all returnable.
  alloc.check_invariants();
  EXPECT_EQ(alloc.memory_stats().at("allocated_bytes.all.current"), 0);
  alloc.empty_cache();
  EXPECT_EQ(dev.live_bytes(), 0u);
}

TEST(FindMaxBatchSize, EdgeCases) {
  auto never = [](int64_t) { throw OutOfMemoryError("no room"); };
  EXPECT_EQ(find_max_batch_size(never).max_batch, 0);
  BatchSearchOptions o;
  o.max_batch = 100;
  EXPECT_EQ(find_max_batch_size([](int64_t) {}, o).max_batch, 100);
  EXPECT_THROW(find_max_batch_size([](int64_t) { throw ValueError("bad"); }), ValueError);
  o.start = 0;
  EXPECT_THROW(find_max_batch_size([](int64_t) {}, o), ValueError);
}

// A model whose forward "runs out of memory" above 37 rows: the model overload's glue.
class Limited : public Module {
 public:
  Limited() : Module("Limited") { lin = register_module("lin", std::make_shared<Linear>(4, 2)); }
  Tensor forward(const Tensor& x) override {
    if (x.size(0) > 37) throw OutOfMemoryError("Limited: " + std::to_string(x.size(0)) + " rows");
    return (*lin)(x);
  }
  std::shared_ptr<Linear> lin;
};

// The trial steps' random draws (dropout, here rand) leave the default generator as it was, in
// both searches.
TEST(FindMaxBatchSize, TrialStepsLeaveTheDefaultGeneratorAsItWas) {
  const PhiloxState before = default_generator().get_state();
  find_max_batch_size(
      [](int64_t b) {
        rand({b}, {DType::f32});
        if (b > 4) throw OutOfMemoryError("trial: batch " + std::to_string(b) + " does not fit");
      },
      {1, 64});
  fit_to_budget(
      {{"only", [] {}}}, [] { rand({16}, {DType::f32}); }, 1, Device::cpu());
  const PhiloxState after = default_generator().get_state();
  EXPECT_EQ(after.seed, before.seed);
  EXPECT_EQ(after.offset, before.offset);
}

TEST(FindMaxBatchSize, ModelOverloadLeavesNoGradients) {
  Limited m;
  BatchSearchResult r = find_max_batch_size(m, randn({3, 4}));
  EXPECT_EQ(r.max_batch, 37);
  for (const Tensor& p : m.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(FindMaxBatchSize, CudaUnderPerProcessLimit) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  Generator g(5);
  auto model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(1024, 4096, true, TensorOptions{DType::f32, dev}, &g), std::make_shared<ReLU>(),
      std::make_shared<Linear>(4096, 1024, true, TensorOptions{DType::f32, dev}, &g)});
  Tensor sample = randn({4, 1024}, {DType::f32, dev});
  // One step first: cuBLAS's workspace (32 MiB from our allocator) lives as long as its
  // handle, so the baseline is taken after it exists.
  mg::sum((*model)(sample)).backward();
  model->zero_grad(/*set_to_none=*/true);
  cuda::empty_cache();
  const int64_t base = memory_allocated(dev);
  cuda::set_per_process_memory_limit(512 * static_cast<int64_t>(MiB));
  BatchSearchResult r = find_max_batch_size(*model, sample);
  cuda::set_per_process_memory_limit(0);
  EXPECT_GT(r.max_batch, 256);
  EXPECT_EQ(memory_allocated(dev), base);  // every failed try gave its memory back
  std::cout << "max batch under 512 MiB: " << r.max_batch << " after " << r.tries.size() << " tries\n";
}

TEST(SplitBatches, FitTheBudgetAndCoverEverySampleOnce) {
  Generator g(9);
  std::vector<int64_t> sizes;
  Tensor u = randint(1, 512, {200}, {DType::i64}, &g);
  for (double v : u.to_vector<double>()) sizes.push_back(static_cast<int64_t>(v));
  LinearMemoryModel est{1 << 20, 4096};  // 1 MiB + 4 KiB per padded token
  const int64_t budget = 64 << 20;
  auto batches = split_batches_by_memory(sizes, budget, est);
  std::map<int64_t, int> seen;
  int64_t units = 0;
  for (const auto& b : batches) {
    int64_t longest = 0;
    for (int64_t i : b) {
      seen[i]++;
      longest = std::max(longest, sizes[i]);
      units += sizes[i];
    }
    EXPECT_LE(est(static_cast<int64_t>(b.size()), longest), budget);
  }
  EXPECT_EQ(seen.size(), sizes.size());
  for (auto& [i, n] : seen) EXPECT_EQ(n, 1) << "sample " << i;
  // Sorting by length keeps padding low: far fewer batches than one per sample.
  EXPECT_LT(batches.size(), sizes.size() / 8);
  EXPECT_THROW(split_batches_by_memory({10, 100000}, budget, est), OutOfMemoryError);
}

TEST(SplitBatches, LinearModelFitsMeasurements) {
  auto measure = [](int64_t units) { return 3000 + 12 * units; };
  LinearMemoryModel m = fit_linear_memory_model(measure, 10, 1000);
  EXPECT_DOUBLE_EQ(m.bytes_per_unit, 12.0);
  EXPECT_DOUBLE_EQ(m.fixed_bytes, 3000.0);
  EXPECT_EQ(m(4, 50), 3000 + 12 * 200);
}

// fit_to_budget over two real configurations of one step (8 tanh(x @ w) layers, plain or
// checkpointed in 4 segments), with budgets placed by the step's own measured peaks on the CPU
// allocator: the first option that fits is chosen and left applied; with a budget below both,
// none is chosen, the smaller one is left applied and the summary names it.
TEST(FitToBudget, ChoosesTheFirstOptionThatFitsOrSaysTheSmallestPeak) {
  manual_seed(0);
  Tensor w = nn::parameter(mul(randn({128, 128}), 0.05));
  Tensor x = randn({256, 128});
  std::vector<std::function<Tensor(const Tensor&)>> layers(8, [&](const Tensor& h) { return tanh(matmul(h, w)); });
  int mode = 0;  // 0 plain, 1 checkpointed
  auto step = [&] {
    Tensor y = x;
    if (mode == 0)
      for (auto& f : layers) y = f(y);
    else
      y = mg::checkpoint_sequential(layers, 4, x);
    mean(square(y)).backward();
    w.set_grad(Tensor());
  };
  auto peak_of = [&](int m) {
    mode = m;
    reset_peak_memory_stats(Device::cpu());
    step();
    return max_memory_allocated(Device::cpu());
  };
  const int64_t plain = peak_of(0), ckpt = peak_of(1);
  ASSERT_LT(ckpt, plain) << "checkpointing should lower this step's peak";
  const std::vector<BudgetOption> options{{"plain", [&] { mode = 0; }}, {"checkpoint 4 segments", [&] { mode = 1; }}};

  BudgetFitResult r = fit_to_budget(options, step, plain, Device::cpu());
  EXPECT_EQ(r.chosen, 0);
  EXPECT_EQ(mode, 0);
  ASSERT_EQ(r.peaks.size(), 1u);
  EXPECT_EQ(r.peaks[0].second, plain);

  r = fit_to_budget(options, step, (plain + ckpt) / 2, Device::cpu());
  EXPECT_EQ(r.chosen, 1);
  EXPECT_EQ(mode, 1);
  ASSERT_EQ(r.peaks.size(), 2u);
  EXPECT_EQ(r.peaks[1].second, ckpt);
  EXPECT_NE(r.summary((plain + ckpt) / 2).find("fits: checkpoint 4 segments"), std::string::npos);

  // Below both: nothing fits; the smaller is left applied, first in the list or not.
  const std::vector<BudgetOption> reversed{options[1], options[0]};
  r = fit_to_budget(reversed, step, ckpt - 1, Device::cpu());
  EXPECT_FALSE(r.fits());
  EXPECT_EQ(r.smallest, "checkpoint 4 segments");
  EXPECT_EQ(r.smallest_peak, ckpt);
  EXPECT_EQ(mode, 1);
  EXPECT_NE(r.summary(ckpt - 1).find("does not fit: the smallest peak is"), std::string::npos) << r.summary(ckpt - 1);

  // An option whose step runs out of memory counts as not fitting.
  const std::vector<BudgetOption> with_oom{{"too big", [&] { mode = 2; }}, options[1]};
  auto step_or_oom = [&] {
    if (mode == 2) MG_THROW(OutOfMemoryError, "test: out of memory");
    step();
  };
  r = fit_to_budget(with_oom, step_or_oom, plain, Device::cpu());
  EXPECT_EQ(r.chosen, 1);
  EXPECT_EQ(r.peaks[0].second, -1);

  EXPECT_THROW(fit_to_budget({}, step, plain, Device::cpu()), ValueError);
  EXPECT_THROW(fit_to_budget(options, step, 0, Device::cpu()), ValueError);
}

// fit_state_to_budget over four state modes whose state is a tensor of 4, 2 and 1 MiB (the
// parameter-offload mode's setup runs out of memory), each with two rungs that add 2 or 0.5 MiB
// of activations in the step: modes are tried fastest first, each set up after the one before
// was torn down, and the first rung that fits in the first mode where one does is chosen and left
// set up; the summary names the mode and the rung, or the smallest peak when nothing fits.
TEST(FitStateToBudget, TriesTheModesFastestFirstAndKeepsTheFirstThatFits) {
  constexpr int64_t MiB = 1 << 20;
  Tensor state;            // the mode set up now
  int64_t activation = 0;  // the rung applied now
  std::vector<StateMode> set_up;
  auto setup = [&](StateMode m) {
    set_up.push_back(m);
    state = Tensor();  // the mode before goes first
    if (m == StateMode::ParameterOffload) MG_THROW(OutOfMemoryError, "test: the state does not fit");
    const int64_t mib = m == StateMode::Resident ? 4 : m == StateMode::EightBit ? 2 : 1;
    state = zeros({mib * MiB / 4});
    StateTrial t;
    t.ladder = {{"plain", [&] { activation = 2 * MiB; }}, {"small", [&] { activation = MiB / 2; }}};
    t.step = [&] { Tensor a = zeros({activation / 4}); };
    return t;
  };
  const std::vector<StateMode> all = {StateMode::Resident, StateMode::EightBit, StateMode::OptimizerOffload,
                                      StateMode::ParameterOffload};
  // Peaks: resident 6 / 4.5 MiB, 8-bit 4 / 2.5, optimizer offload 3 / 1.5 (over what was held).
  const int64_t held = memory_allocated(Device::cpu());
  StateFitResult r = fit_state_to_budget(all, setup, held + 3 * MiB, Device::cpu());
  ASSERT_TRUE(r.fits()) << r.summary(held + 3 * MiB);
  EXPECT_EQ(r.modes[r.chosen], StateMode::EightBit);
  EXPECT_EQ(r.ladders[r.chosen].peaks[r.ladders[r.chosen].chosen].first, "small");
  EXPECT_EQ(set_up, (std::vector<StateMode>{StateMode::Resident, StateMode::EightBit}));
  EXPECT_EQ(state.numel(), 2 * MiB / 4) << "the chosen mode stays set up";
  EXPECT_EQ(activation, MiB / 2) << "with its rung applied";
  EXPECT_NE(r.summary(held + 3 * MiB).find("fits: 8-bit optimizer state, small"), std::string::npos)
      << r.summary(held + 3 * MiB);
  // Each mode's peaks are its own: 4 MiB of state more than 8-bit's is resident's first rung.
  EXPECT_EQ(r.ladders[0].peaks[0].second - r.ladders[1].peaks[0].second, 2 * MiB);

  // Below every rung of the modes that set up: the parameter-offload setup's OOM is a mode with
  // no rung; the summary names the smallest peak (optimizer offload's small rung).
  set_up.clear();
  r = fit_state_to_budget(all, setup, held + MiB, Device::cpu());
  EXPECT_FALSE(r.fits());
  EXPECT_EQ(set_up, all);
  ASSERT_EQ(r.ladders.size(), 4u);
  EXPECT_TRUE(r.ladders[3].peaks.empty());
  EXPECT_NE(r.summary(held + MiB).find("(optimizer offload, small)"), std::string::npos) << r.summary(held + MiB);

  EXPECT_THROW(fit_state_to_budget({}, setup, MiB, Device::cpu()), ValueError);
  EXPECT_THROW(fit_state_to_budget(all, setup, 0, Device::cpu()), ValueError);
}

}  // namespace
}  // namespace mg::nn
