// A small training run the checkpoint fuzz tests save and load: a model, Adam, an LR schedule, a
// GradScaler and a generator, all registered with one TrainingCheckpoint.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "serialize/serialize.h"
#include "serialize/training_checkpoint.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test

struct TrainingRun {
  std::shared_ptr<Sequential> model;
  std::unique_ptr<optim::Adam> opt;
  std::unique_ptr<optim::StepLR> sched;
  optim::GradScaler scaler;
  Generator gen{11};
  TrainingCheckpoint ckpt;

  explicit TrainingRun(uint64_t seed) {
    manual_seed(seed);
    // GELU rather than ReLU: no unit is dead, so every gradient element is nonzero and eps = 0
    // (a legal option a mutation can produce) cannot make 0 / 0.
    model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(6, 8), std::make_shared<GELU>(), std::make_shared<Linear>(8, 3)});
    optim::AdamOptions o;
    o.lr = 0.01;
    opt = std::make_unique<optim::Adam>(model->parameters(), o);
    sched = std::make_unique<optim::StepLR>(*opt, 2, 0.5);
    ckpt.add("model", *model).add("optimizer", *opt).add("scheduler", *sched).add("scaler", scaler);
    ckpt.add_generator("rng", gen);
  }

  // Random gradients (never exactly zero) and one optimizer and schedule step.
  void step(uint64_t seed) {
    Generator g(seed);
    for (auto& p : model->parameters()) p.set_grad(randn(p.sizes(), {}, &g));
    opt->step();
    sched->step();
    ++ckpt.step;
  }

  // Everything a load may change, as bytes.
  std::string snapshot() const { return save_to_bytes(ckpt.state_dict()); }

  bool parameters_finite() const {
    for (auto& p : model->parameters())
      for (float v : p.to_vector<float>())
        if (!std::isfinite(v)) return false;
    return true;
  }
};

}  // namespace mg::nn
