// A project embedding memgrad: a two-layer net learns y = x0 * x1 + x0^2 on random data
// and prints its loss falling. Built and run by CI from this separate workspace.
#include <cstdio>
#include <memory>

#include "memgrad.h"

int main() {
  mg::manual_seed(0);
  auto net = std::make_shared<mg::nn::Sequential>(std::initializer_list<std::shared_ptr<mg::nn::Module>>{
      std::make_shared<mg::nn::Linear>(2, 64), std::make_shared<mg::nn::ReLU>(),
      std::make_shared<mg::nn::Linear>(64, 1)});
  mg::optim::SGDOptions opts;
  opts.lr = 0.05;
  opts.momentum = 0.9;
  mg::optim::SGD opt(net->parameters(), opts);

  mg::Tensor x = mg::uniform({1024, 2}, -1.0, 1.0);
  mg::Tensor x0 = x.select(1, 0), x1 = x.select(1, 1);
  mg::Tensor y = (x0 * x1 + mg::square(x0)).unsqueeze(1);

  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    mg::Tensor loss = mg::mse_loss(net->forward(x), y);
    loss.backward();
    opt.step();
    last = loss.item();
    if (step == 0) first = last;
    if (step % 50 == 0) std::printf("step %3d  loss %.5f\n", step, last);
  }
  std::printf("loss %.5f -> %.5f\n", first, last);
  if (!(last < first * 0.1)) {
    std::fprintf(stderr, "the two-layer net did not learn (loss %.5f -> %.5f)\n", first, last);
    return 1;
  }
  return 0;
}
