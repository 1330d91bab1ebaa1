// optim/state_by_name.h: a tiny GPT (f32, CPU) whose parameters two AdamW optimizers step (its
// blocks' Linears and the rest, HostParams' split) resumes bit-identically under one AdamW over
// all of it in a separately built model, and the reverse; AdamW8bit's codes move as well; bad
// input is a ValueError naming the parameter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/state_by_name.h"
#include "tests/error_of.h"

namespace mg::optim {
namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = 97, c.block_size = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 64;
  return c;
}

std::shared_ptr<nn::GPT> gpt(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::GPT>(tiny());
}

// The parameters that are not the blocks' Linears (embeddings, norms): the device's share.
std::vector<Tensor> others(nn::GPT& m) {
  std::vector<Tensor> linear = nn::gpt_linear_params(m), out;
  for (const Tensor& p : m.parameters())
    if (std::none_of(linear.begin(), linear.end(), [&](const Tensor& l) { return l.is_same(p); })) out.push_back(p);
  return out;
}

// One step of every optimizer in `opts` on step s's batch (the same batches in every run).
void train(nn::GPT& m, const std::vector<Optimizer*>& opts, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    Generator data(100 + s);
    const Tensor idx = randint(0, 97, {4, 16}, {DType::i64}, &data), tgt = randint(0, 97, {4, 16}, {DType::i64}, &data);
    for (Optimizer* o : opts) o->zero_grad();
    m.forward_loss(idx, tgt).backward();
    for (Optimizer* o : opts) o->step();
  }
}

// Every parameter's bytes, by name.
void expect_bitwise_equal(nn::GPT& a, nn::GPT& b) {
  const Named na = a.named_parameters(), nb = b.named_parameters();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    ASSERT_EQ(na[i].first, nb[i].first);
    const std::vector<float> x = na[i].second.to_vector<float>(), y = nb[i].second.to_vector<float>();
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << na[i].first << " differs";
  }
}

template <class Opt, class Options>
std::unique_ptr<Optimizer> make(std::vector<Tensor> ps, double lr = 1e-2) {
  Options o;
  o.lr = lr;
  return std::make_unique<Opt>(std::move(ps), o);
}

// AdamW's update is elementwise per parameter (its step count is the parameter's own): stepping
// the parameters with two optimizers or with one runs the same arithmetic on each element, so
// the single optimizer that loads the merged state continues the split run bit for bit.
template <class Opt, class Options>
void merged_state_resumes_bitwise() {
  const int n = 3, k = 3;
  auto a = gpt(0);
  auto host = make<Opt, Options>(nn::gpt_linear_params(*a)), device = make<Opt, Options>(others(*a));
  train(*a, {host.get(), device.get()}, 0, n);
  const Named na = a->named_parameters();
  const StateDict host_sd = host->state_dict(), device_sd = device->state_dict();

  auto b = gpt(7);  // other initial values: everything comes from the checkpoint
  b->load_state_dict(a->state_dict());
  auto one = make<Opt, Options>(b->parameters());
  one->load_state_dict(merge_state_dicts({{host_sd, param_names(*host, na)}, {device_sd, param_names(*device, na)}},
                                         named_state(*one, b->named_parameters())));
  for (const Tensor& p : b->parameters()) {
    ASSERT_NE(one->state(p), nullptr);
    EXPECT_EQ(one->state(p)->step, n);
  }
  train(*a, {host.get(), device.get()}, n, k);
  train(*b, {one.get()}, n, k);
  expect_bitwise_equal(*a, *b);
}

TEST(StateByName, MergedAdamWStateResumesBitIdentically) { merged_state_resumes_bitwise<AdamW, AdamWOptions>(); }

TEST(StateByName, MergedAdamW8bitStateResumesBitIdentically) {
  // The blocks' weights (64 x 192 and larger) hold u8 codes and a scale per block; biases f32.
  merged_state_resumes_bitwise<AdamW8bit, AdamW8bitOptions>();
}

TEST(StateByName, SplitStateResumesBitIdentically) {
  const int n = 3, k = 3;
  auto a = gpt(0);
  auto one = make<AdamW, AdamWOptions>(a->parameters());
  train(*a, {one.get()}, 0, n);

  auto b = gpt(7);
  b->load_state_dict(a->state_dict());
  auto host = make<AdamW, AdamWOptions>(nn::gpt_linear_params(*b)), device = make<AdamW, AdamWOptions>(others(*b));
  const Named nb = b->named_parameters();
  const std::vector<StateDict> parts =
      split_state_dict(named_state(*one, a->named_parameters()), {named_state(*host, nb), named_state(*device, nb)});
  ASSERT_EQ(parts.size(), 2u);
  host->load_state_dict(parts[0]);
  device->load_state_dict(parts[1]);
  EXPECT_EQ(host->state_size() + device->state_size(), b->parameters().size());
  train(*a, {one.get()}, n, k);
  train(*b, {host.get(), device.get()}, n, k);
  expect_bitwise_equal(*a, *b);
}

// The group options come from the saved parts (a scheduled lr resumes), the "params" lists from the target.
TEST(StateByName, OptionsComeFromThePartsLayoutFromTheTarget) {
  auto a = gpt(0);
  auto host = make<AdamW, AdamWOptions>(nn::gpt_linear_params(*a), 3e-3),
       device = make<AdamW, AdamWOptions>(others(*a), 3e-3);
  train(*a, {host.get(), device.get()}, 0, 1);
  const Named na = a->named_parameters();
  auto one = make<AdamW, AdamWOptions>(a->parameters(), 1e-2);
  const StateDict merged = merge_state_dicts({named_state(*host, na), named_state(*device, na)}, named_state(*one, na));
  one->load_state_dict(merged);
  EXPECT_EQ(one->param_groups()[0].lr(), 3e-3);
  EXPECT_EQ(merged.meta["param_groups"][0]["params"].size(), a->parameters().size());
}

TEST(StateByName, BadInputNamesTheParameter) {
  auto a = gpt(0);
  auto host = make<AdamW, AdamWOptions>(nn::gpt_linear_params(*a)), device = make<AdamW, AdamWOptions>(others(*a));
  train(*a, {host.get(), device.get()}, 0, 1);
  const Named na = a->named_parameters();
  const NamedState h = named_state(*host, na), d = named_state(*device, na);
  auto one = make<AdamW, AdamWOptions>(a->parameters());
  const NamedState target = named_state(*one, na);
  auto has = [](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(what), std::string::npos) << "\"" << msg << "\" does not say " << what;
  };

  // A target parameter in no part: the device's first one (in the target's order).
  std::string msg = testing::error_of<ValueError>([&] { merge_state_dicts({h}, target); });
  has(msg, "\"" + d.names[0] + "\"");
  has(msg, "in no part");

  // A name in two parts.
  msg = testing::error_of<ValueError>([&] { merge_state_dicts({h, d, h}, target); });
  has(msg, "\"" + h.names[0] + "\"");
  has(msg, "part 0");
  has(msg, "part 2");

  // Two optimizer types.
  SGD sgd(others(*a), SGDOptions{.lr = 0.1, .momentum = 0.9});
  train(*a, {host.get(), &sgd}, 1, 1);
  msg = testing::error_of<ValueError>([&] { merge_state_dicts({h, named_state(sgd, na)}, target); });
  has(msg, "SGD");
  has(msg, "AdamW");

  // Different options for parameters of one target group.
  auto device2 = make<AdamW, AdamWOptions>(others(*a), 2e-2);
  msg = testing::error_of<ValueError>([&] { merge_state_dicts({h, named_state(*device2, na)}, target); });
  has(msg, "lr = ");
  has(msg, "\"" + h.names[0] + "\"");

  // A part's parameter the target does not have: its state would be lost.
  msg = testing::error_of<ValueError>([&] { merge_state_dicts({h, d}, h); });
  has(msg, "\"" + d.names[0] + "\"");
  has(msg, "dropped");

  // Names that do not match the part's parameter count.
  NamedState short_names = h;
  short_names.names.pop_back();
  has(testing::error_of<ValueError>([&] { merge_state_dicts({short_names, d}, target); }), "names");

  // The split: a saved parameter in no target, and one in two.
  msg = testing::error_of<ValueError>([&] { split_state_dict(target, {h}); });
  has(msg, "\"" + d.names[0] + "\"");
  has(msg, "dropped");
  msg = testing::error_of<ValueError>([&] { split_state_dict(target, {h, d, h}); });
  has(msg, "\"" + h.names[0] + "\"");

  // An optimizer parameter that is not among the named tensors.
  has(testing::error_of<ValueError>([&] { param_names(*host, {}); }), "parameter 0");
}

}  // namespace
}  // namespace mg::optim
