// Loading damaged optimizer, scheduler and scaler state: each bad entry is an mg::ValueError
// (ShapeError for shapes) naming the group or parameter, the buffer and the value, and the
// object is bit-identical to before; what is accepted steps to finite parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

// Everything an optimizer would carry into its next step, as text and bytes.
std::string snapshot(const Optimizer& opt) {
  StateDict sd = opt.state_dict();
  std::string out = sd.meta.dump();
  for (auto& [k, t] : sd.tensors) {
    Tensor c = raw::contiguous(t.cpu());
    out += "|" + k + ":" + std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  return out;
}

bool all_finite(const std::vector<Tensor>& ps) {
  for (auto& p : ps)
    for (double v : p.to_vector<double>())
      if (!std::isfinite(v)) return false;
  return true;
}

void set_grads(const std::vector<Tensor>& ps, uint64_t seed) {
  Generator g(seed);
  for (auto& p : ps) p.set_grad(randn(p.sizes(), {p.dtype()}, &g));
}

// A trained optimizer's state_dict: its source for the damaged copies.
struct Trained {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> opt;
  StateDict sd;
};

Trained trained_adam(bool fused, bool amsgrad) {
  manual_seed(5);
  Trained t;
  t.params = {nn::parameter(randn({4, 3})), nn::parameter(randn({3}))};
  AdamOptions o;
  o.lr = 0.01;
  o.fused = fused;
  o.amsgrad = amsgrad;
  t.opt = std::make_unique<Adam>(t.params, o);
  for (int i = 0; i < 3; ++i) {
    set_grads(t.params, 10 + i);
    t.opt->step();
  }
  t.sd = t.opt->state_dict();
  for (auto& [k, v] : t.sd.tensors) v = v.clone();
  return t;
}

// Loads `bad` into `opt`, expecting E with every one of `parts` in its message, then checks
// nothing changed and the optimizer still steps to finite parameters.
template <class E>
void expect_rejected(Optimizer& opt, const std::vector<Tensor>& params, const StateDict& bad,
                     const std::vector<std::string>& parts) {
  const std::string before = snapshot(opt);
  try {
    opt.load_state_dict(bad);
    ADD_FAILURE() << "accepted; expected an error mentioning \"" << parts.front() << "\"";
  } catch (const E& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  EXPECT_EQ(snapshot(opt), before) << "a rejected load changed the optimizer";
  set_grads(params, 99);
  opt.step();
  EXPECT_TRUE(all_finite(params));
}

// exp_avg without exp_avg_sq used to be accepted; the next fused step read a missing buffer
// (a segfault), the unfused one created an empty one.
TEST(OptimizerLoad, AdamNeedsEveryMomentBuffer) {
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    Trained src = trained_adam(fused, false);
    Trained dst = trained_adam(fused, false);
    StateDict bad = src.sd;
    bad.tensors.erase("state.0.exp_avg_sq");
    expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"parameter 0", "group 0", "exp_avg_sq"});
    bad = src.sd;
    bad.tensors.erase("state.1.exp_avg");
    expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"parameter 1", "exp_avg"});
    bad = src.sd;
    bad.tensors["state.1.momentum_buffer"] = zeros({3});
    expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"state.1.momentum_buffer", "not a buffer Adam keeps"});
  }
}

TEST(OptimizerLoad, AmsgradNeedsItsMaximumButMayKeepIt) {
  Trained ams = trained_adam(true, true);
  Trained dst = trained_adam(true, true);
  StateDict bad = ams.sd;
  bad.tensors.erase("state.0.max_exp_avg_sq");
  expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"max_exp_avg_sq"});
  // amsgrad turned off after it ran: the maximum stays in the state, and a load takes it.
  StateDict off = ams.sd;
  off.meta["param_groups"][0]["amsgrad"] = 0.0;
  dst.opt->load_state_dict(off);
  EXPECT_EQ(dst.opt->param_groups()[0].get("amsgrad"), 0.0);
  off.meta["param_groups"][0]["amsgrad"] = 0.5;
  expect_rejected<ValueError>(*dst.opt, dst.params, off, {"amsgrad", "0.5"});
}

// Step -5 used to be accepted; the unfused update's bias corrections 1 - beta^step went
// negative and the parameters non-finite (step -1: a division by zero).
TEST(OptimizerLoad, StepMustBeANonNegativeInteger) {
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    Trained src = trained_adam(fused, false);
    Trained dst = trained_adam(fused, false);
    for (int64_t step : {-5, -1}) {
      StateDict bad = src.sd;
      bad.meta["state"]["1"]["step"] = step;
      expect_rejected<ValueError>(*dst.opt, dst.params, bad,
                                  {"parameter 1", "group 0", "step " + std::to_string(step), ">= 0"});
    }
    StateDict bad = src.sd;
    bad.meta["state"]["0"]["step"] = 2.5;
    expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"parameter 0", "integer \"step\""});
    // step 0 with moments (saved before the first increment) is legal and steps finitely.
    StateDict zero = src.sd;
    zero.meta["state"]["0"]["step"] = 0;
    dst.opt->load_state_dict(zero);
    set_grads(dst.params, 3);
    dst.opt->step();
    EXPECT_TRUE(all_finite(dst.params));
  }
}

TEST(OptimizerLoad, BuffersMustMatchShapeDtypeAndInvariants) {
  Trained src = trained_adam(true, false);
  Trained dst = trained_adam(true, false);
  StateDict bad = src.sd;
  bad.tensors["state.0.exp_avg"] = zeros({3, 4});
  expect_rejected<ShapeError>(*dst.opt, dst.params, bad, {"state.0.exp_avg", "[3, 4]", "[4, 3]"});
  bad = src.sd;
  bad.tensors["state.1.exp_avg"] = zeros({3}, DType::i64);
  expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"state.1.exp_avg", "i64"});
  bad = src.sd;
  Tensor neg = bad.tensors["state.1.exp_avg_sq"].clone();
  neg.data_ptr<float>()[2] = -1.0f;  // sqrt of a negative running square: NaN updates
  bad.tensors["state.1.exp_avg_sq"] = neg;
  expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"state.1.exp_avg_sq", "element 2", "-1", ">= 0"});
  bad = src.sd;
  Tensor nan = bad.tensors["state.0.exp_avg"].clone();
  nan.data_ptr<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  bad.tensors["state.0.exp_avg"] = nan;
  expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"state.0.exp_avg", "element 0", "finite"});
  // Another floating dtype is converted to the one the optimizer keeps (f32 here).
  StateDict f64 = src.sd;
  for (auto& [k, t] : f64.tensors) t = t.to(DType::f64);
  dst.opt->load_state_dict(f64);
  EXPECT_EQ(dst.opt->state(dst.params[0])->buffers.at("exp_avg").dtype(), DType::f32);
}

TEST(OptimizerLoad, OptionsAndIndicesAreChecked) {
  Trained src = trained_adam(true, false);
  Trained dst = trained_adam(true, false);
  StateDict bad = src.sd;
  bad.meta["param_groups"][0]["lr"] = -0.5;
  expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"group 0", "learning rate", "-0.5"});
  bad = src.sd;
  bad.meta["param_groups"][0]["initial_lr"] = std::numeric_limits<double>::infinity();
  expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"initial_lr", "finite"});
  for (const char* key : {"01", "1x", "-1", "", "99999999999999999999"}) {
    bad = src.sd;
    bad.meta["state"][key] = bad.meta["state"]["1"];
    expect_rejected<ValueError>(*dst.opt, dst.params, bad, {"parameter index"});
  }
}

TEST(OptimizerLoad, SgdMomentumNeedsItsBuffer) {
  std::vector<Tensor> ps = {nn::parameter(randn({3}))};
  SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  SGD opt(ps, o);
  set_grads(ps, 1);
  opt.step();
  StateDict sd = opt.state_dict();
  StateDict bad = sd;
  bad.tensors.erase("state.0.momentum_buffer");
  expect_rejected<ValueError>(opt, ps, bad, {"momentum_buffer"});
  bad = sd;
  bad.meta["param_groups"][0]["nesterov"] = 2.0;
  expect_rejected<ValueError>(opt, ps, bad, {"nesterov"});
  // With momentum 0 the buffer is optional: a leftover one loads.
  sd.meta["param_groups"][0]["momentum"] = 0.0;
  opt.load_state_dict(sd);
}

// Entries of the wrong JSON type used to escape as nlohmann exceptions (not mg::Error).
TEST(SchedulerLoad, WrongTypesAreValueErrorsAndChangeNothing) {
  std::vector<Tensor> ps = {nn::parameter(randn({3}))};
  SGD opt(ps, SGDOptions());
  StepLR sched(opt, 2, 0.5);
  sched.step();
  const StateDict sd = sched.state_dict();
  const double lr = opt.param_groups()[0].lr();
  for (const char* json : {R"(["x"])", R"([1e999])", R"({"a": 1})", R"(3)"}) {
    StateDict bad = sd;
    bad.meta["base_lrs"] = nlohmann::json::parse(json, nullptr, false);
    EXPECT_THROW(sched.load_state_dict(bad), ValueError) << json;
  }
  StateDict bad = sd;
  bad.meta["last_epoch"] = -3;
  EXPECT_THROW(sched.load_state_dict(bad), ValueError);
  EXPECT_EQ(sched.last_epoch(), 1);
  EXPECT_EQ(opt.param_groups()[0].lr(), lr);

  ReduceLROnPlateau plateau(opt);
  plateau.step(1.0);
  const StateDict psd = plateau.state_dict();
  for (auto [key, json] : std::vector<std::pair<const char*, const char*>>{{"min_lrs", R"("x")"},
                                                                           {"min_lrs", "[-1]"},
                                                                           {"num_bad_epochs", "-2"},
                                                                           {"last_epoch", R"("1")"},
                                                                           {"best", R"("low")"},
                                                                           {"cooldown_counter", "1.5"}}) {
    StateDict b = psd;
    b.meta[key] = nlohmann::json::parse(json);
    EXPECT_THROW(plateau.load_state_dict(b), ValueError) << key << " = " << json;
  }
  EXPECT_EQ(plateau.best(), 1.0);
  plateau.load_state_dict(psd);
}

TEST(ScalerLoad, CountersMustBeIntegers) {
  GradScaler s;
  StateDict sd = s.state_dict();
  StateDict bad = sd;
  bad.meta["growth_interval"] = 2.5;
  EXPECT_THROW(s.load_state_dict(bad), ValueError);
  bad = sd;
  bad.meta["growth_factor"] = std::numeric_limits<double>::infinity();
  EXPECT_THROW(s.load_state_dict(bad), ValueError);
  EXPECT_EQ(s.options().growth_interval, GradScalerOptions().growth_interval);
  s.load_state_dict(sd);
}

}  // namespace
}  // namespace mg::optim
