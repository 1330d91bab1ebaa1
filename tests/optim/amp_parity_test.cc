// AMP parity: the main job's Fashion-MNIST CNN trained in f32, in f16 autocast + GradScaler
// and in bf16 autocast from the same initial weights and batch order; the final test
// accuracies must agree within 0.5 points. Runs on CUDA (about 2 x 3 epochs-worth of tiny
// kernels: seconds on an H200); skips without a GPU or without the data set
// ($MG_FASHION_MNIST or the Debian dataset-fashion-mnist package's directory).
// MG_AMP_PARITY_DEVICE=cpu runs the bf16 case on the CPU instead (slow; a smoke check), with
// MG_AMP_PARITY_LIMIT training images and MG_AMP_PARITY_EPOCHS epochs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autograd/functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "data/fashion_mnist.h"
#include "kernels/ops.h"
#include "nn/nn.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

namespace mg {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

// The main job's --model cnn (examples/fashion_mnist.cc make_cnn, dropout 0): two
// Conv3x3(no bias)-BN-ReLU-MaxPool2 blocks (32, 64 channels), Linear(64*7*7, 128)-ReLU,
// Linear(128, 10).
std::shared_ptr<nn::Sequential> cnn(Device d) {
  const TensorOptions opts(DType::f32, d);
  auto m = std::make_shared<nn::Sequential>();
  int64_t in = 1;
  for (int64_t out : {32, 64}) {
    m->push_back(std::make_shared<nn::Conv2d>(in, out, 3, 1, 1, 1, 1, /*bias=*/false, opts));
    m->push_back(std::make_shared<nn::BatchNorm2d>(out, 1e-5, 0.1, true, true, opts));
    m->push_back(std::make_shared<nn::ReLU>(true));
    m->push_back(std::make_shared<nn::MaxPool2d>(2));
    in = out;
  }
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 128, true, opts));
  m->push_back(std::make_shared<nn::ReLU>(true));
  m->push_back(std::make_shared<nn::Linear>(128, 10, true, opts));
  return m;
}

struct Data {
  Tensor train_x, train_y, test_x, test_y;
};

struct RunResult {
  double accuracy = 0;
  int64_t skipped = 0;
  double final_scale = 1;
};

// Same seed (weights and batch order) for every precision: only the arithmetic differs.
// SGD(momentum 0.9) with a cosine learning rate that ends at 0, so the last steps do not
// leave the weights wherever the last noisy batch put them.
RunResult train(const Data& data, Device d, DType precision, int64_t epochs, int64_t batch) {
  manual_seed(0);
  auto model = cnn(d);
  optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  const bool amp = precision != DType::f32;
  optim::GradScaler scaler({.enabled = precision == DType::f16});
  const int64_t n = data.train_x.size(0), steps_per_epoch = n / batch, total = epochs * steps_per_epoch;
  Generator order(1);
  int64_t step = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    model->train();
    Tensor perm = randperm(n, &order).to(d);
    for (int64_t b = 0; b < steps_per_epoch; ++b, ++step) {
      Tensor idx = raw::slice(perm, 0, b * batch, (b + 1) * batch, 1);
      Tensor x = kernels::index_select(data.train_x, 0, idx), y = kernels::index_select(data.train_y, 0, idx);
      for (auto& g : opt.param_groups())
        g.set_lr(0.5 * 0.05 * (1 + std::cos(M_PI * static_cast<double>(step) / static_cast<double>(total))));
      opt.zero_grad();
      Tensor loss;
      {
        Autocast ac(d.type, amp ? precision : DType::bf16, amp);
        loss = cross_entropy((*model)(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    }
  }
  // Evaluated the way the model was trained (under the same autocast).
  model->eval();
  NoGradGuard ng;
  Autocast ac(d.type, amp ? precision : DType::bf16, amp);
  int64_t correct = 0;
  const int64_t m = data.test_x.size(0);
  for (int64_t s = 0; s < m; s += 1000) {
    const int64_t e = std::min(m, s + 1000);
    Tensor pred = kernels::argmax((*model)(raw::slice(data.test_x, 0, s, e, 1)), 1);
    correct += static_cast<int64_t>(
        kernels::sum(kernels::binary(kernels::Binary::Eq, pred, raw::slice(data.test_y, 0, s, e, 1)).to(DType::i64))
            .item());
  }
  return {static_cast<double>(correct) / static_cast<double>(m), scaler.skipped_steps(), scaler.get_scale()};
}

TEST(AmpParity, FashionMnistCnnF16AndBf16MatchF32Accuracy) {
  const bool on_cpu = std::getenv("MG_AMP_PARITY_DEVICE") && std::string(std::getenv("MG_AMP_PARITY_DEVICE")) == "cpu";
  if (!on_cpu && !cuda::is_available())
    GTEST_SKIP() << "no CUDA device (MG_AMP_PARITY_DEVICE=cpu runs bf16 on the CPU)";
  const std::string root = data::FashionMNIST::default_root();
  if (!data::FashionMNIST::available(root)) GTEST_SKIP() << "Fashion-MNIST not found at " << root;
  const Device d = on_cpu ? Device::cpu() : Device::cuda(0);
  data::FashionMNISTOptions tr;
  tr.normalize = true;
  tr.limit = env_int("MG_AMP_PARITY_LIMIT", -1);
  data::FashionMNISTOptions te;
  te.normalize = true;
  data::FashionMNIST train_set(data::Split::Train, root, tr), test_set(data::Split::Test, root, te);
  Data data{train_set.images().to(d), train_set.labels().to(d), test_set.images().to(d), test_set.labels().to(d)};
  const int64_t epochs = env_int("MG_AMP_PARITY_EPOCHS", 2), batch = 128;

  const RunResult f32 = train(data, d, DType::f32, epochs, batch);
  std::printf("f32  accuracy %.2f%%\n", 100 * f32.accuracy);
  EXPECT_GT(f32.accuracy, on_cpu ? 0.5 : 0.88) << "the f32 baseline did not train";
  std::vector<DType> lows = on_cpu ? std::vector<DType>{DType::bf16} : std::vector<DType>{DType::f16, DType::bf16};
  for (DType lp : lows) {
    const RunResult r = train(data, d, lp, epochs, batch);
    std::printf("%-4s accuracy %.2f%% (%+.2f points), %lld skipped steps, final loss scale %g\n", dtype_name(lp),
                100 * r.accuracy, 100 * (r.accuracy - f32.accuracy), static_cast<long long>(r.skipped), r.final_scale);
    EXPECT_LE(std::abs(r.accuracy - f32.accuracy), 0.005)
        << dtype_name(lp) << " autocast: " << 100 * r.accuracy << "% vs f32 " << 100 * f32.accuracy << "%";
    // A scaler that skipped a large share of steps would be hiding a precision bug.
    EXPECT_LT(r.skipped, 20) << dtype_name(lp);
  }
}

}  // namespace
}  // namespace mg
