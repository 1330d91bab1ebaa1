// Pruning: masks by L1 magnitude / at random / globally, the reparametrization (mask in forward
// and backward, recomputed every call), iterative pruning, remove(), sparsity, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/device_runtime.h"
#include "core/state_dict.h"
#include "nn/nn.h"
#include "nn/prune.h"

namespace mg::nn {
namespace {

using prune::Amount;

// Weights whose |value| ranks are known: entry i holds +-(perm[i] + 1).
void set_ranked_weights(Linear& fc, const std::vector<int>& perm) {
  std::vector<double> w(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) w[i] = (i % 2 ? -1.0 : 1.0) * (perm[i] + 1);
  NoGradGuard ng;
  fc.weight.copy_(from_vector(w, fc.weight.sizes(), {DType::f32}));
}

std::vector<int> shuffled(int n, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> p = randperm(n, &g).to_vector<int64_t>();
  return std::vector<int>(p.begin(), p.end());
}

int64_t count_zeros(const Tensor& t) {
  auto v = t.to_vector<double>();
  return std::count(v.begin(), v.end(), 0.0);
}

TEST(Prune, L1FractionZeroesTheSmallestMagnitudes) {
  Linear fc(4, 3);
  auto perm = shuffled(12, 1);
  set_ranked_weights(fc, perm);
  prune::l1_unstructured(fc, "weight", Amount::fraction(0.5));
  auto mask = fc.buffer("weight_mask").to_vector<double>();
  auto w = fc.weight.to_vector<double>();
  for (size_t i = 0; i < perm.size(); ++i) {
    const bool small = perm[i] < 6;  // |w| in 1..6: the six smallest
    EXPECT_EQ(mask[i], small ? 0.0 : 1.0) << "entry " << i;
    EXPECT_EQ(w[i] == 0.0, small) << "entry " << i;
  }
  EXPECT_DOUBLE_EQ(prune::sparsity(fc.weight), 0.5);
}

TEST(Prune, ReparametrizationKeepsTheLeafAndListsOrigAndMask) {
  Linear fc(5, 2);
  Tensor original = fc.weight;
  prune::l1_unstructured(fc, "weight", Amount::count(3));
  EXPECT_TRUE(prune::is_pruned(fc, "weight"));
  EXPECT_FALSE(prune::is_pruned(fc, "bias"));
  // The trained leaf moved to weight_orig: an optimizer holding it keeps updating it.
  EXPECT_TRUE(fc.param("weight_orig").is_same(original));
  std::vector<std::string> names;
  for (auto& [n, t] : fc.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "weight_orig"}));
  EXPECT_EQ(fc.named_buffers().at(0).first, "weight_mask");
  EXPECT_EQ(fc.num_parameters(), 5 * 2 + 2);
  StateDict sd = fc.state_dict();
  EXPECT_EQ(sd.tensors.size(), 3u);
  EXPECT_TRUE(sd.tensors.count("weight_orig") && sd.tensors.count("weight_mask") && sd.tensors.count("bias"));
  EXPECT_EQ(count_zeros(fc.buffer("weight_mask")), 3);
}

TEST(Prune, MaskAppliesInForwardAndIsRecomputedEachCall) {
  Linear fc(6, 4);
  prune::l1_unstructured(fc, "weight", Amount::fraction(0.4));
  Tensor orig = fc.param("weight_orig");
  Tensor mask = fc.buffer("weight_mask");
  Tensor x = randn({3, 6});
  auto check = [&] {
    auto y = fc(x).to_vector<double>();
    auto ref = linear(x, mul(orig, mask), fc.bias).to_vector<double>();
    ASSERT_EQ(y.size(), ref.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y[i], ref[i]);
  };
  check();
  // An optimizer step changes weight_orig in place; the next forward must see it.
  {
    NoGradGuard ng;
    orig.copy_(add(orig, full_like(orig, 0.25)));
  }
  check();
  auto w = fc.weight.to_vector<double>(), m = mask.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i)
    if (m[i] == 0.0) {
      EXPECT_EQ(w[i], 0.0);
    }
}

TEST(Prune, GradientOfOrigIsMaskedGradient) {
  Linear pruned(5, 3), plain(5, 3);
  prune::random_unstructured(pruned, "weight", Amount::fraction(0.5));
  Tensor orig = pruned.param("weight_orig"), mask = pruned.buffer("weight_mask");
  {
    NoGradGuard ng;
    plain.weight.copy_(mul(orig, mask));
    plain.bias.copy_(pruned.bias);
  }
  Tensor x = randn({4, 5});
  sum(mul(pruned(x), pruned(x))).backward();
  sum(mul(plain(x), plain(x))).backward();
  auto g = orig.grad().to_vector<double>(), ref = plain.weight.grad().to_vector<double>();
  auto m = mask.to_vector<double>();
  int nonzero_ref = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_FLOAT_EQ(g[i], ref[i] * m[i]) << "entry " << i;
    nonzero_ref += m[i] == 0.0 && ref[i] != 0.0;
  }
  EXPECT_GT(nonzero_ref, 0);  // the plain gradient is nonzero where the mask cut it
}

TEST(Prune, IterativePruningCompoundsOnWhatRemains) {
  Linear fc(4, 5);                                              // 20 weights
  prune::l1_unstructured(fc, "weight", Amount::fraction(0.5));  // 10
  auto first = fc.buffer("weight_mask").to_vector<double>();
  prune::l1_unstructured(fc, "weight", Amount::fraction(0.5));  // round(0.5 * 10) = 5 more
  auto second = fc.buffer("weight_mask").to_vector<double>();
  EXPECT_EQ(std::count(second.begin(), second.end(), 0.0), 15);
  for (size_t i = 0; i < first.size(); ++i)
    if (first[i] == 0.0) {
      EXPECT_EQ(second[i], 0.0);  // pruned stays pruned
    }
  prune::random_unstructured(fc, "weight", Amount::count(5));
  EXPECT_EQ(count_zeros(fc.buffer("weight_mask")), 20);
  EXPECT_THROW(prune::random_unstructured(fc, "weight", Amount::count(1)), ValueError);
  // Python's round (half to even): 0.5 * 3 = 1.5 -> 2.
  Linear small(3, 1);
  prune::l1_unstructured(small, "weight", Amount::fraction(0.5));
  EXPECT_EQ(count_zeros(small.buffer("weight_mask")), 2);
}

TEST(Prune, RandomIsSeededAndExact) {
  Linear a(8, 8), b(8, 8), c(8, 8);
  Generator g1(11), g2(11), g3(12);
  prune::random_unstructured(a, "weight", Amount::count(20), &g1);
  prune::random_unstructured(b, "weight", Amount::count(20), &g2);
  prune::random_unstructured(c, "weight", Amount::count(20), &g3);
  auto ma = a.buffer("weight_mask").to_vector<double>();
  EXPECT_EQ(std::count(ma.begin(), ma.end(), 0.0), 20);
  EXPECT_EQ(ma, b.buffer("weight_mask").to_vector<double>());
  EXPECT_NE(ma, c.buffer("weight_mask").to_vector<double>());
}

TEST(Prune, GlobalRanksAcrossModules) {
  Linear big(6, 4), small(6, 4);
  {
    NoGradGuard ng;
    small.weight.copy_(mul(small.weight, 0.01));  // tiny weights: global pruning takes them first
  }
  std::vector<double> all = big.weight.to_vector<double>();
  auto sv = small.weight.to_vector<double>();
  all.insert(all.end(), sv.begin(), sv.end());
  std::vector<double> mags(all.size());
  for (size_t i = 0; i < all.size(); ++i) mags[i] = std::fabs(all[i]);
  std::vector<double> sorted = mags;
  std::sort(sorted.begin(), sorted.end());
  const double cut = sorted[19];  // 20 of 48 pruned

  prune::global_unstructured({{&big, "weight"}, {&small, "weight"}}, prune::Method::L1Unstructured,
                             Amount::fraction(20.0 / 48.0));
  auto mb = big.buffer("weight_mask").to_vector<double>(), ms = small.buffer("weight_mask").to_vector<double>();
  std::vector<double> mask = mb;
  mask.insert(mask.end(), ms.begin(), ms.end());
  for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(mask[i] == 0.0, mags[i] <= cut) << "entry " << i;
  EXPECT_EQ(std::count(ms.begin(), ms.end(), 0.0), 20);  // all from the small layer
  EXPECT_EQ(std::count(mb.begin(), mb.end(), 0.0), 0);

  EXPECT_THROW(prune::global_unstructured({}, prune::Method::L1Unstructured, Amount::count(1)), ValueError);
  EXPECT_THROW(prune::global_unstructured({{&big, "weight"}, {&big, "weight"}}, prune::Method::RandomUnstructured,
                                          Amount::count(1)),
               ValueError);
}

TEST(Prune, RemoveMakesItPermanentAndRestoresTheParameter) {
  Linear fc(4, 3);
  Tensor original = fc.weight;
  prune::l1_unstructured(fc, "weight", Amount::fraction(0.25));
  auto effective = fc.weight.to_vector<double>();
  prune::remove(fc, "weight");
  EXPECT_FALSE(prune::is_pruned(fc, "weight"));
  EXPECT_TRUE(fc.weight.is_same(original));  // the member and the optimizer's handle agree again
  EXPECT_TRUE(fc.weight.is_leaf() && fc.weight.requires_grad());
  EXPECT_EQ(fc.weight.to_vector<double>(), effective);
  std::vector<std::string> names;
  for (auto& [n, t] : fc.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
  EXPECT_TRUE(fc.named_buffers().empty());
  EXPECT_FALSE(fc.has_forward_pre_hook("prune.weight"));
  // Nothing re-masks it any more: writes to weight stick through forward.
  {
    NoGradGuard ng;
    fc.weight.fill_(1.0);
  }
  fc(randn({2, 4}));
  EXPECT_EQ(count_zeros(fc.weight), 0);
  EXPECT_THROW(prune::remove(fc, "weight"), ValueError);
}

TEST(Prune, TrainingKeepsPrunedWeightsAtZeroInsideSequential) {
  manual_seed(3);
  auto fc1 = std::make_shared<Linear>(8, 16);
  auto fc2 = std::make_shared<Linear>(16, 2);
  Sequential net({fc1, std::make_shared<ReLU>(), fc2});
  prune::l1_unstructured(*fc1, "weight", Amount::fraction(0.6));
  Tensor x = randn({32, 8}), y = randn({32, 2});
  for (int step = 0; step < 5; ++step) {
    net.zero_grad();
    mse_loss(net(x), y).backward();
    NoGradGuard ng;
    for (Tensor& p : net.parameters()) p.copy_(sub(p, mul(p.grad(), 0.1)));
  }
  // weight_orig trained everywhere the mask keeps, and the pruned entries stay at 0.
  auto m = fc1->buffer("weight_mask").to_vector<double>();
  auto w = fc1->weight.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i)
    if (m[i] == 0.0) {
      EXPECT_EQ(w[i], 0.0);
    }
  prune::SparsityReport r = prune::sparsity(net);
  ASSERT_EQ(r.entries.size(), 4u);
  EXPECT_EQ(r.entries[1].name, "0.weight");
  EXPECT_EQ(r.entries[1].numel, 128);
  EXPECT_EQ(r.entries[1].zeros, std::count(m.begin(), m.end(), 0.0));
  EXPECT_NEAR(r.entries[1].sparsity(), 0.6, 1.0 / 128);
  EXPECT_EQ(r.numel, 8 * 16 + 16 + 16 * 2 + 2);
  EXPECT_NE(r.str().find("0.weight"), std::string::npos);
  EXPECT_NE(r.str().find("total"), std::string::npos);
  // Eval under no_grad uses the mask too.
  net.eval();
  NoGradGuard ng;
  EXPECT_EQ(net(x).sizes(), (Shape{32, 2}));
}

TEST(Prune, CustomMaskAndErrors) {
  Linear fc(3, 2);
  Tensor mask = from_vector(std::vector<double>{1, 0, 1, 1, 0, 1}, {2, 3});
  prune::custom_from_mask(fc, "weight", mask);
  EXPECT_EQ(count_zeros(fc.buffer("weight_mask")), 2);
  EXPECT_THROW(prune::custom_from_mask(fc, "weight", ones({3, 2})), ShapeError);
  EXPECT_THROW(Amount::fraction(1.5), ValueError);
  EXPECT_THROW(Amount::fraction(-0.1), ValueError);
  EXPECT_THROW(Amount::fraction(NAN), ValueError);
  EXPECT_THROW(Amount::count(-1), ValueError);
  Linear other(3, 2);
  EXPECT_THROW(prune::l1_unstructured(other, "weight", Amount::count(7)), ValueError);
  EXPECT_THROW(prune::l1_unstructured(other, "nope", Amount::count(1)), ValueError);
  Linear nobias(3, 2, false);
  EXPECT_THROW(prune::l1_unstructured(nobias, "bias", Amount::count(1)), ValueError);
  try {
    prune::l1_unstructured(other, "weight", Amount::count(7));
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("l1_unstructured"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("6"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(prune::is_pruned(other, "weight"));  // the failed call changed nothing
}

TEST(Prune, SurvivesDtypeCastAndStateDictRoundTrip) {
  Linear fc(4, 4);
  prune::l1_unstructured(fc, "weight", Amount::fraction(0.5));
  fc.to(DType::f64);
  EXPECT_EQ(fc.buffer("weight_mask").dtype(), DType::f64);
  Tensor y = fc(randn({2, 4}, {DType::f64}));
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_EQ(count_zeros(fc.weight), 8);
  // A pruned model loads into a model pruned the same way (keys weight_orig / weight_mask).
  Linear other(4, 4);
  other.to(DType::f64);
  prune::random_unstructured(other, "weight", Amount::fraction(0.5));
  other.load_state_dict(fc.state_dict());
  other(randn({1, 4}, {DType::f64}));
  EXPECT_EQ(other.weight.to_vector<double>(), fc.weight.to_vector<double>());
  Linear unpruned(4, 4);
  EXPECT_THROW(unpruned.load_state_dict(fc.state_dict()), ValueError);
}

TEST(PruneCuda, MaskOnTheDeviceMatchesTheHost) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Linear host(16, 8), dev(16, 8);
  {
    NoGradGuard ng;
    dev.weight.copy_(host.weight);
    dev.bias.copy_(host.bias);
  }
  dev.to(Device::cuda(0));
  prune::l1_unstructured(host, "weight", Amount::fraction(0.4));
  prune::l1_unstructured(dev, "weight", Amount::fraction(0.4));
  EXPECT_TRUE(dev.buffer("weight_mask").is_cuda());
  EXPECT_EQ(dev.buffer("weight_mask").to_vector<double>(), host.buffer("weight_mask").to_vector<double>());
  Tensor x = randn({4, 16});
  Tensor yd = dev(x.cuda());
  EXPECT_TRUE(yd.is_cuda());
  sum(yd).backward();
  sum(host(x)).backward();
  auto gd = dev.param("weight_orig").grad().to_vector<double>(),
       gh = host.param("weight_orig").grad().to_vector<double>();
  auto m = host.buffer("weight_mask").to_vector<double>();
  for (size_t i = 0; i < gd.size(); ++i) {
    if (m[i] == 0.0) {
      EXPECT_EQ(gd[i], 0.0) << i;
    } else {
      EXPECT_NEAR(gd[i], gh[i], 1e-5) << i;
    }
  }
  prune::remove(dev, "weight");
  EXPECT_TRUE(dev.weight.is_cuda());
  EXPECT_EQ(prune::sparsity(dev).zeros, prune::sparsity(host).zeros);
}

}  // namespace
}  // namespace mg::nn
