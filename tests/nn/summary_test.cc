// nn::summary: the table's rows and counts, and the peak training memory estimate against
// the peak measured on the CPU allocator over a real step (forward, backward, SGD with
// momentum), within 10%, on an MLP and a small CNN.
#include "nn/summary.h"

#include <gtest/gtest.h>

#include <iostream>

#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "optim/sgd.h"

namespace mg::nn {
namespace {

// Measured peak of the second training step (the first creates the momentum buffers),
// counting only what the step itself and the model hold (the input batch is excluded).
int64_t measured_step_peak(Module& model, const Tensor& x) {
  optim::SGDOptions o;
  o.lr = 1e-3;
  o.momentum = 0.9;
  optim::SGD opt(model.parameters(), o);
  auto step = [&] {
    opt.zero_grad(true);
    Tensor loss = mean(square(model(x)));
    loss.backward();
    opt.step();
  };
  step();
  opt.zero_grad(true);
  const int64_t outside = memory_allocated() - model.num_parameters() * 4 * 2;  // minus params and momentum
  reset_peak_memory_stats();
  step();
  return max_memory_allocated() - outside;
}

void expect_within_10_percent(const ModelSummary& s, int64_t measured) {
  const double ratio = static_cast<double>(s.peak_bytes) / static_cast<double>(measured);
  std::cout << "estimated " << format_bytes(s.peak_bytes) << ", measured " << format_bytes(measured) << " (ratio "
            << ratio << ")\n";
  EXPECT_GT(ratio, 0.9) << s.str() << "measured " << format_bytes(measured);
  EXPECT_LT(ratio, 1.1) << s.str() << "measured " << format_bytes(measured);
}

TEST(Summary, MlpTableAndPeakWithin10Percent) {
  manual_seed(1);
  Sequential model{std::make_shared<Linear>(512, 1024), std::make_shared<ReLU>(), std::make_shared<Linear>(1024, 1024),
                   std::make_shared<ReLU>(), std::make_shared<Linear>(1024, 10)};
  Tensor x = randn({256, 512});
  SummaryOptions so;
  so.optimizer = "sgd_momentum";
  ModelSummary s = summary(model, x, so);
  ASSERT_EQ(s.rows.size(), 5u);
  EXPECT_EQ(s.rows[0].name, "0");
  EXPECT_EQ(s.rows[0].type, "Linear");
  EXPECT_EQ(s.rows[0].output_shape, (Shape{256, 1024}));
  EXPECT_EQ(s.rows[4].output_shape, (Shape{256, 10}));
  EXPECT_EQ(s.rows[0].params, 512 * 1024 + 1024);
  EXPECT_EQ(s.total_params, model.num_parameters());
  EXPECT_EQ(s.parameter_bytes, model.num_parameters() * 4);
  EXPECT_EQ(s.gradient_bytes, s.parameter_bytes);
  EXPECT_EQ(s.optimizer_bytes, s.parameter_bytes);
  EXPECT_GT(s.rows[0].activation_bytes, 0);
  EXPECT_NE(s.str().find("optimizer state"), std::string::npos);
  // The summary's own forward left nothing behind and touched no gradient.
  for (const Tensor& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
  expect_within_10_percent(s, measured_step_peak(model, x));
}

TEST(Summary, CnnPeakWithin10Percent) {
  manual_seed(2);
  Sequential model{std::make_shared<Conv2d>(3, 16, 3, 1, 1),  std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
                   std::make_shared<Conv2d>(16, 32, 3, 1, 1), std::make_shared<ReLU>(), std::make_shared<Flatten>(),
                   std::make_shared<Linear>(32 * 16 * 16, 10)};
  Tensor x = randn({32, 3, 32, 32});
  SummaryOptions so;
  so.optimizer = "sgd_momentum";
  ModelSummary s = summary(model, x, so);
  ASSERT_EQ(s.rows.size(), 7u);
  EXPECT_EQ(s.rows[2].output_shape, (Shape{32, 16, 16, 16}));
  expect_within_10_percent(s, measured_step_peak(model, x));
}

TEST(Summary, NestedSequentialExpandsAndSharedParametersCountOnce) {
  auto shared = std::make_shared<Linear>(8, 8);
  Sequential model{std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{shared}),
                   std::make_shared<Linear>(8, 4)};
  ModelSummary s = summary(model, Shape{2, 8});
  ASSERT_EQ(s.rows.size(), 2u);
  EXPECT_EQ(s.rows[0].name, "0.0");
  EXPECT_EQ(s.total_params, model.num_parameters());
}

TEST(Summary, UnknownOptimizerIsAValueError) {
  Sequential model{std::make_shared<Linear>(4, 4)};
  SummaryOptions so;
  so.optimizer = "lion";
  EXPECT_THROW(summary(model, Shape{2, 4}, so), ValueError);
}

}  // namespace
}  // namespace mg::nn
