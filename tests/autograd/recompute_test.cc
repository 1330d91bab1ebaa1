// Checkpoint regions: gradients equal the plain run's bitwise on CPU (f64 and f32), the
// replay sees the forward's RNG stream and autocast state, several outputs, inputs without
// grad, regions without parameters, nesting, recompute_outputs, memory kept, and errors.
#include "autograd/recompute.h"

#include <gtest/gtest.h>

#include <optional>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/functions.h"
#include "autograd/transformer_functions.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/random.h"

namespace mg {
namespace {

Tensor param(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(s, {dt}, &g);
  t.requires_grad_(true);
  return t;
}

// A small two-layer block with dropout: everything a replay has to reproduce.
struct Block {
  Tensor w1, b1, w2;
  double p = 0.0;
  Block(int64_t d, DType dt, uint64_t seed, double p = 0.0)
      : w1(param({4 * d, d}, dt, seed)), b1(param({4 * d}, dt, seed + 1)), w2(param({d, 4 * d}, dt, seed + 2)), p(p) {}
  Tensor operator()(const Tensor& x) const { return add(x, linear(dropout(gelu(linear(x, w1, b1)), p, true), w2)); }
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

void clear_grads(const std::vector<Tensor>& ts) {
  for (Tensor t : ts) t.set_grad(Tensor());
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& ts) {
  std::vector<Tensor> g;
  for (const Tensor& t : ts) g.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
  return g;
}

void expect_bitwise(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "gradient " << i;
    EXPECT_EQ(a[i].to_vector<double>(), b[i].to_vector<double>()) << "gradient " << i;
  }
}

class CheckpointDType : public ::testing::TestWithParam<DType> {};

TEST_P(CheckpointDType, GradientsBitwiseEqualPlainRunWithDropout) {
  const DType dt = GetParam();
  Block b1(8, dt, 10, 0.25), b2(8, dt, 20, 0.25);
  Generator gx(3);
  Tensor x = randn({4, 5, 8}, {dt}, &gx);
  x.requires_grad_(true);
  std::vector<Tensor> all = b1.params();
  for (auto& t : b2.params()) all.push_back(t);
  all.push_back(x);

  manual_seed(77);
  sum(square(b2(b1(x)))).backward();
  const PhiloxState rng_after_plain = default_generator().get_state();
  auto plain = grads_of(all);
  clear_grads(all);

  manual_seed(77);
  const int64_t replays = checkpoint_replay_count();
  Tensor h = checkpoint([&](const Tensor& in) { return b1(in); }, x);
  Tensor y = checkpoint([&](const Tensor& in) { return b2(in); }, h);
  sum(square(y)).backward();
  EXPECT_EQ(checkpoint_replay_count() - replays, 2);
  // The replays drew the forward's masks and put the stream back where it was.
  EXPECT_EQ(default_generator().get_state().offset, rng_after_plain.offset);
  expect_bitwise(grads_of(all), plain);
}

INSTANTIATE_TEST_SUITE_P(CPU, CheckpointDType, ::testing::Values(DType::f64, DType::f32));

TEST(Checkpoint, SeveralOutputsOneUnused) {
  Tensor a = param({3, 4}, DType::f64, 1), w = param({4, 4}, DType::f64, 2);
  auto region = [&](const std::vector<Tensor>& in) {
    Tensor h = matmul(in[0], w);
    return std::vector<Tensor>{tanh(h), exp(h), sigmoid(h)};
  };
  auto plain = region({a});
  sum(mul(plain[0], plain[1])).backward();  // output 2 unused
  auto want = grads_of({a, w});
  clear_grads({a, w});
  auto out = checkpoint(region, {a});
  ASSERT_EQ(out.size(), 3u);
  sum(mul(out[0], out[1])).backward();
  expect_bitwise(grads_of({a, w}), want);
}

TEST(Checkpoint, InputWithoutGradParametersStillGetGradients) {
  Tensor x = randn({5, 6}, {DType::f64});  // data: no grad
  Tensor w = param({6, 3}, DType::f64, 4);
  auto f = [&](const Tensor& in) { return relu(matmul(in, w)); };
  sum(f(x)).backward();
  auto want = grads_of({w});
  clear_grads({w});
  Tensor y = checkpoint(f, x);
  ASSERT_TRUE(y.requires_grad());
  sum(y).backward();
  expect_bitwise(grads_of({w}), want);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Checkpoint, RegionWithoutParametersAndNothingRequiringGrad) {
  Tensor x = param({7}, DType::f64, 5);
  auto g = [](const Tensor& in) { return mul(tanh(in), in); };
  sum(g(x)).backward();
  auto want = grads_of({x});
  clear_grads({x});
  sum(checkpoint(g, x)).backward();
  expect_bitwise(grads_of({x}), want);
  // Nothing requires grad: a plain result, no node.
  Tensor c = checkpoint(g, x.detach());
  EXPECT_FALSE(c.requires_grad());
}

TEST(Checkpoint, NestedRegions) {
  Block b1(6, DType::f64, 30), b2(6, DType::f64, 40), b3(6, DType::f64, 50);
  Tensor x = param({2, 3, 6}, DType::f64, 6);
  std::vector<Tensor> all = b1.params();
  for (auto* b : {&b2, &b3})
    for (auto& t : b->params()) all.push_back(t);
  all.push_back(x);
  sum(b3(b2(b1(x)))).backward();
  auto want = grads_of(all);
  clear_grads(all);
  const int64_t replays = checkpoint_replay_count();
  Tensor y = checkpoint(
      [&](const Tensor& in) {
        Tensor h = checkpoint([&](const Tensor& i2) { return b1(i2); }, in);
        return b3(checkpoint([&](const Tensor& i2) { return b2(i2); }, h));
      },
      x);
  sum(y).backward();
  // The outer region once, then each inner region once during the outer replay's backward.
  EXPECT_EQ(checkpoint_replay_count() - replays, 3);
  expect_bitwise(grads_of(all), want);
}

TEST(Checkpoint, SequentialMatchesPlain) {
  std::vector<Block> blocks;
  for (int i = 0; i < 5; ++i) blocks.emplace_back(4, DType::f64, 100 + 10 * i);
  std::vector<std::function<Tensor(const Tensor&)>> fns;
  std::vector<Tensor> all;
  for (const Block& b : blocks) {
    fns.push_back([&b](const Tensor& in) { return b(in); });
    for (auto& t : b.params()) all.push_back(t);
  }
  Tensor x = param({3, 4}, DType::f64, 9);
  all.push_back(x);
  Tensor y = x;
  for (auto& f : fns) y = f(y);
  sum(y).backward();
  auto want = grads_of(all);
  for (int64_t segments : {1, 2, 3, 5}) {
    clear_grads(all);
    const int64_t replays = checkpoint_replay_count();
    sum(checkpoint_sequential(fns, segments, x)).backward();
    EXPECT_EQ(checkpoint_replay_count() - replays, segments - 1) << segments << " segments";
    expect_bitwise(grads_of(all), want);
  }
  EXPECT_THROW(checkpoint_sequential(fns, 0, x), ValueError);
  EXPECT_THROW(checkpoint_sequential(fns, 6, x), ValueError);
}

TEST(Checkpoint, ReplayRestoresAutocastState) {
  Tensor x = param({4}, DType::f32, 11);
  std::vector<AutocastState> seen;
  auto f = [&](const Tensor& in) {
    seen.push_back(autocast_state());
    return mul(in, in);
  };
  Tensor y;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    y = checkpoint(f, x);
  }
  ASSERT_FALSE(autocast_state().cpu_enabled);
  sum(y).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[1].cpu_enabled);
  EXPECT_EQ(seen[1], seen[0]);
  EXPECT_FALSE(autocast_state().cpu_enabled);  // backward's own state came back
}

TEST(Checkpoint, KeepsOnlyInputsDuringForward) {
  // Eight elementwise steps over a 1 MiB tensor: plain keeps each step's saved inputs.
  Tensor x = param({1 << 17}, DType::f64, 12);
  auto f = [](const Tensor& in) {
    Tensor h = in;
    for (int i = 0; i < 8; ++i) h = tanh(h);
    return h;
  };
  const int64_t base = memory_allocated();
  Tensor plain = f(x);
  const int64_t plain_bytes = memory_allocated() - base;
  plain = Tensor();
  const int64_t base2 = memory_allocated();
  Tensor ck = checkpoint(f, x);
  const int64_t ck_bytes = memory_allocated() - base2;
  const int64_t one = x.numel() * 8;
  EXPECT_GE(plain_bytes, 8 * one);  // every tanh output is saved by the next tanh (or is the result)
  EXPECT_LE(ck_bytes, one + 4096);  // only the region's output
  sum(ck).backward();
  EXPECT_TRUE(x.grad().defined());
}

TEST(Checkpoint, RecomputeOutputsDropsWhatConsumersSave) {
  // linear -> [gelu, recomputed] -> linear: the second linear saves the gelu output, which a
  // recompute_outputs region does not keep.
  Tensor x = param({64, 32}, DType::f64, 13), w1 = param({128, 32}, DType::f64, 14),
         w2 = param({32, 128}, DType::f64, 15);
  std::vector<Tensor> all{x, w1, w2};
  sum(linear(gelu(linear(x, w1)), w2)).backward();
  auto want = grads_of(all);
  clear_grads(all);

  CheckpointOptions opts;
  opts.recompute_outputs = true;
  opts.name = "gelu (recomputed)";
  Tensor h = linear(x, w1);
  const int64_t before = memory_allocated();
  Tensor y = linear(checkpoint([](const Tensor& in) { return gelu(in); }, h, opts), w2);
  // Only y itself is new: the gelu output died with its temporary.
  EXPECT_LE(memory_allocated() - before, y.numel() * 8 + 4096);
  const int64_t replays = checkpoint_replay_count();
  sum(y).backward();
  EXPECT_EQ(checkpoint_replay_count() - replays, 1);  // shared by linear's backward and gelu's
  expect_bitwise(grads_of(all), want);
}

// A pre-norm MLP block with dropout: what the selective policy is for.
Tensor mlp_block(const Tensor& x, const std::vector<Tensor>& p) {
  Tensor h = layer_norm(x, {x.size(-1)}, p[0], p[1], 1e-5);
  h = dropout(gelu(linear(h, p[2], p[3])), 0.1, true);
  return add(x, linear(h, p[4]));
}

// Runs forward() (inside a cheap_ops() scope when `selective`), stores in *kept the bytes it
// left allocated, backpropagates sum(y^2) and returns the gradients of `all`.
template <class F>
std::vector<Tensor> run_selective(const std::vector<Tensor>& all, bool selective, int64_t* kept, F forward) {
  clear_grads(all);
  manual_seed(5);
  const int64_t base = memory_allocated();
  Tensor y;
  {
    std::optional<SelectiveRecompute> scope;
    if (selective) scope.emplace(RecomputePolicy::cheap_ops());
    y = forward();
  }
  *kept = memory_allocated() - base;
  sum(square(y)).backward();
  return grads_of(all);
}

TEST(SelectiveRecompute, CheapOpsGradientsBitwiseAndLessMemory) {
  const int64_t d = 32;
  std::vector<Tensor> p{param({d}, DType::f64, 1), param({d}, DType::f64, 2), param({4 * d, d}, DType::f64, 3),
                        param({4 * d}, DType::f64, 4), param({d, 4 * d}, DType::f64, 5)};
  Tensor x = param({16, 8, d}, DType::f64, 6);
  std::vector<Tensor> all = p;
  all.push_back(x);
  auto run = [&](bool selective, int64_t* kept) {
    return run_selective(all, selective, kept, [&] { return mlp_block(mlp_block(x, p), p); });
  };
  int64_t kept_plain = 0, kept_selective = 0;
  auto want = run(false, &kept_plain);
  const int64_t replays = checkpoint_replay_count();
  auto got = run(true, &kept_selective);
  // layer_norm, gelu and dropout per block, each replayed once.
  EXPECT_EQ(checkpoint_replay_count() - replays, 6);
  expect_bitwise(got, want);
  // Per block, plain keeps ln out (d) + mean/rstd, fc1 out (4d), gelu out (4d), mask (4d),
  // dropout out (4d); selective keeps fc1 out (4d) and the regions' inputs.
  EXPECT_LT(kept_selective, kept_plain / 2) << kept_selective << " vs " << kept_plain;
}

// gelu_mlp's parameters (c_fc [4d, d] and [4d], c_proj [d, 4d] and [d]) and an input [rows, d];
// `all` is the parameters, then the input.
struct MlpCase {
  std::vector<Tensor> p, all;
  Tensor x;
  MlpCase(int64_t d, int64_t rows, uint64_t seed)
      : p{param({4 * d, d}, DType::f64, seed), param({4 * d}, DType::f64, seed + 1),
          param({d, 4 * d}, DType::f64, seed + 2), param({d}, DType::f64, seed + 3)},
        all(p),
        x(param({rows, d}, DType::f64, seed + 4)) {
    all.push_back(x);
  }
};

// gelu_mlp (the fused MLP node) under a policy that rebuilds gelu keeps its fusion and drops
// its GELU output h, rebuilding gelu(pre) for c_proj's weight gradient: on the CPU the same
// kernel on the same pre, so the gradients are bitwise the plain run's, and exactly h's bytes
// (rows * 4d * 8) fewer are kept, with no region replayed.
TEST(SelectiveRecompute, FusedMlpDropsItsGeluOutput) {
  const int64_t d = 16, rows = 64;
  const MlpCase c(d, rows, 11);
  const auto &p = c.p, &all = c.all;
  const Tensor& x = c.x;
  auto run = [&](bool selective, int64_t* kept) {
    return run_selective(all, selective, kept, [&] { return gelu_mlp(x, p[0], p[1], p[2], p[3]); });
  };
  int64_t kept_plain = 0, kept_selective = 0;
  auto want = run(false, &kept_plain);
  const int64_t replays = checkpoint_replay_count();
  auto got = run(true, &kept_selective);
  EXPECT_EQ(checkpoint_replay_count(), replays);
  expect_bitwise(got, want);
  EXPECT_EQ(kept_plain - kept_selective, rows * 4 * d * 8);
}

TEST(SelectiveRecompute, UnknownOpKindIsAValueError) {
  EXPECT_THROW(SelectiveRecompute({{"matmul"}}), ValueError);
  RecomputePolicy p{{"relu"}};
  EXPECT_TRUE(p.recomputes("relu"));
  EXPECT_FALSE(p.recomputes("gelu"));
}

// Selective activation checkpointing: a region that keeps its linears' outputs replays only the
// rest (the GELU, the dropout with the forward's mask, the residual add), so the two GEMMs run
// once. The gradients are the plain run's bitwise: the kept outputs are the forward's own.
TEST(CheckpointKeepOps, KeptLinearsAreTakenNotRecomputedAndGradientsAreBitwise) {
  Block b(8, DType::f64, 60, 0.25);
  Tensor x = param({6, 5, 8}, DType::f64, 7);
  std::vector<Tensor> all = b.params();
  all.push_back(x);
  manual_seed(78);
  sum(square(b(x))).backward();
  auto want = grads_of(all);
  clear_grads(all);

  manual_seed(78);
  CheckpointOptions opts;
  opts.keep_ops = {"linear"};
  const int64_t base = memory_allocated();
  Tensor y = checkpoint([&](const Tensor& in) { return b(in); }, x, opts);
  // Kept: the output y and the two linears' outputs (fc [6, 5, 32], proj [6, 5, 8]), f64.
  EXPECT_LE(memory_allocated() - base, (x.numel() + 30 * 32 + x.numel()) * 8 + 3 * 4096);
  const int64_t reuses = autograd::stash_reuse_count(), replays = checkpoint_replay_count();
  sum(square(y)).backward();
  EXPECT_EQ(checkpoint_replay_count() - replays, 1);
  EXPECT_EQ(autograd::stash_reuse_count() - reuses, 2);  // both linears taken, not run
  expect_bitwise(grads_of(all), want);
}

// The fused MLP keeping its output: the replay runs c_fc and the GELU (backward needs them) but
// not c_proj's GEMM; the gradients are bitwise, and a region keeping nothing it runs still works.
TEST(CheckpointKeepOps, FusedMlpKeepsItsOutput) {
  const MlpCase c(16, 48, 21);
  const auto &p = c.p, &all = c.all;
  const Tensor& x = c.x;
  auto mlp = [&](const Tensor& in) { return add(in, gelu_mlp(in, p[0], p[1], p[2], p[3])); };
  sum(square(mlp(x))).backward();
  auto want = grads_of(all);
  for (const char* keep : {"gelu_mlp", "attention"}) {  // attention: kept nowhere here
    clear_grads(all);
    CheckpointOptions opts;
    opts.keep_ops = {keep};
    const int64_t reuses = autograd::stash_reuse_count();
    sum(square(checkpoint(mlp, x, opts))).backward();
    EXPECT_EQ(autograd::stash_reuse_count() - reuses, std::string(keep) == "gelu_mlp" ? 1 : 0) << keep;
    expect_bitwise(grads_of(all), want);
  }
}

// Under autocast the region's forward casts its f32 weights once (w1, b1, w2 to bf16); keeping
// "weight_casts", the replay records those very casts instead of casting again: the gradients
// are bitwise those of a plain checkpoint, three casts are reused, and the weights' gradients
// still arrive in f32. The same without autocast's weight-cast cache (cache_enabled false): the
// region keeps the casts it asked for whatever the cache does.
TEST(CheckpointKeepOps, WeightCastsAreReusedUnderAutocast) {
  Block b(8, DType::f32, 90);
  Tensor x = param({6, 8}, DType::f32, 26);
  std::vector<Tensor> all = b.params();
  all.push_back(x);
  auto run = [&](std::vector<std::string> keep, bool cache = true) {
    clear_grads(all);
    CheckpointOptions opts;
    opts.keep_ops = std::move(keep);
    Tensor y;
    {
      Autocast ac(DeviceType::CPU, DType::bf16, true, cache);
      y = checkpoint([&](const Tensor& in) { return b(in); }, x, opts);
    }
    sum(y.to(DType::f32)).backward();
    return grads_of(all);
  };
  auto want = run({});
  const int64_t reuses = autograd::stash_reuse_count();
  auto got = run({"weight_casts"});
  EXPECT_EQ(autograd::stash_reuse_count() - reuses, 3);
  expect_bitwise(got, want);
  for (const Tensor& p : b.params()) EXPECT_EQ(p.grad().dtype(), DType::f32);
  const int64_t uncached_reuses = autograd::stash_reuse_count();
  expect_bitwise(run({"weight_casts"}, false), want);
  EXPECT_EQ(autograd::stash_reuse_count() - uncached_reuses, 3);
  const int64_t none = autograd::stash_reuse_count();
  expect_bitwise(run({}, false), want);
  EXPECT_EQ(autograd::stash_reuse_count(), none);
}

// Nested regions keep what the outermost region keeps: the inner region's forward inside the
// outer replay takes the outer forward's kept output, and its own replay later runs the op.
TEST(CheckpointKeepOps, NestedRegionUsesTheOuterStash) {
  Block b1(6, DType::f64, 70), b2(6, DType::f64, 80);
  Tensor x = param({3, 6}, DType::f64, 8);
  std::vector<Tensor> all = b1.params();
  for (auto& t : b2.params()) all.push_back(t);
  all.push_back(x);
  sum(b2(b1(x))).backward();
  auto want = grads_of(all);
  clear_grads(all);
  CheckpointOptions outer, inner;
  outer.keep_ops = {"linear"};
  inner.keep_ops = {"linear"};  // ignored inside the outer region
  Tensor y = checkpoint(
      [&](const Tensor& in) { return b2(checkpoint([&](const Tensor& i2) { return b1(i2); }, in, inner)); }, x, outer);
  sum(y).backward();
  expect_bitwise(grads_of(all), want);
}

// A region that writes a kept output in place after the op made it (y = linear(x, w); y += 1) is
// still a function of its inputs: the replay finds the kept copy changed, runs the linear again,
// and the gradients are the plain run's bitwise.
TEST(CheckpointKeepOps, KeptOutputWrittenInPlaceIsRecomputed) {
  Tensor x = param({4, 8}, DType::f64, 27), w = param({8, 8}, DType::f64, 28);
  auto f = [&](const Tensor& in) {
    Tensor y = linear(in, w);
    add_(y, 1.0);
    return tanh(y);
  };
  sum(f(x)).backward();
  auto want = grads_of({x, w});
  clear_grads({x, w});
  CheckpointOptions opts;
  opts.keep_ops = {"linear"};
  const int64_t reuses = autograd::stash_reuse_count();
  sum(checkpoint(f, x, opts)).backward();
  EXPECT_EQ(autograd::stash_reuse_count(), reuses);  // taken as changed, not reused
  expect_bitwise(grads_of({x, w}), want);
}

TEST(CheckpointKeepOps, UnknownKindAndAReplayThatCallsOtherOpsAreErrors) {
  Tensor x = param({4, 8}, DType::f64, 9), w = param({8, 8}, DType::f64, 10);
  CheckpointOptions opts;
  opts.keep_ops = {"matmul"};
  try {
    checkpoint([&](const Tensor& in) { return linear(in, w); }, x, opts);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("\"matmul\""), std::string::npos) << e.what();
  }
  // The replay skips the linear the forward ran: one kept output left untaken.
  opts.keep_ops = {"linear"};
  int calls = 0;
  Tensor y = checkpoint([&](const Tensor& in) { return ++calls == 1 ? tanh(linear(in, w)) : tanh(in); }, x, opts);
  try {
    sum(y).backward();
    FAIL() << "expected AutogradError";
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("took 0 of the 1 kept"), std::string::npos) << e.what();
  }
  // The replay runs the linear on fewer rows: the kept output's shape does not match.
  calls = 0;
  Tensor u = checkpoint([&](const Tensor& in) { return linear(calls++ == 0 ? in : in.narrow(0, 0, 2), w); }, x, opts);
  try {
    sum(u).backward();
    FAIL() << "expected AutogradError";
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("kept output has shape [4, 8], this call makes [2, 8]"), std::string::npos)
        << e.what();
  }
  // The replay runs one linear more than the forward did: nothing is kept for the second.
  calls = 0;
  Tensor z =
      checkpoint([&](const Tensor& in) { return calls++ == 0 ? linear(in, w) : linear(linear(in, w), w); }, x, opts);
  try {
    sum(z).backward();
    FAIL() << "expected AutogradError";
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("nothing more"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, InPlaceOnSavedInputIsAnErrorAtBackward) {
  Tensor x = param({5}, DType::f64, 16);
  Tensor h = mul(x, 2.0);
  Tensor y = checkpoint([](const Tensor& in) { return exp(in); }, h);
  {
    NoGradGuard ng;
    add_(h, 1.0);
  }
  try {
    sum(y).backward();
    FAIL() << "expected AutogradError";
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SecondBackwardNeedsRetainGraph) {
  Tensor x = param({5}, DType::f64, 17);
  Tensor y = sum(checkpoint([](const Tensor& in) { return exp(in); }, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  Tensor g = x.grad();
  auto e = exp(x.detach()).to_vector<double>();
  auto got = g.to_vector<double>();
  for (size_t i = 0; i < e.size(); ++i) EXPECT_DOUBLE_EQ(got[i], 2 * e[i]);
  EXPECT_THROW(y.backward(), AutogradError);
}

TEST(Checkpoint, ReplayWithOtherShapeIsAnError) {
  Tensor x = param({6}, DType::f64, 18);
  int calls = 0;
  Tensor y = checkpoint([&](const Tensor& in) { return ++calls == 1 ? exp(in) : exp(in.narrow(0, 0, 3)); }, x);
  EXPECT_THROW(sum(y).backward(), AutogradError);
}

TEST(Checkpoint, NoGradModeJustRuns) {
  Tensor x = param({3}, DType::f64, 19);
  NoGradGuard ng;
  const int64_t replays = checkpoint_replay_count();
  Tensor y = checkpoint([](const Tensor& in) { return exp(in); }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(checkpoint_replay_count(), replays);
}

}  // namespace
}  // namespace mg
