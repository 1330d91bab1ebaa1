// TrainingCheckpoint: train N steps straight through, or stop at k, checkpoint, rebuild everything
// fresh (other seed, other RNG position), resume, and get bit-identical losses and weights. Dropout
// and SGD momentum make the RNG and optimizer state matter; errors name what does not fit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "autograd/functions.h"
#include "core/device_runtime.h"
#include "nn/nn.h"
#include "serialize/training_checkpoint.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  fs::path d = fs::path(t ? t : "/tmp") / ("training_checkpoint_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// One training run's objects, created from `init_seed` (weights, dropout stream) and a data stream.
struct TrainingRun {
  std::shared_ptr<Sequential> model;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<optim::SequentialLR> sched;
  std::unique_ptr<optim::GradScaler> scaler;
  Generator data{0};
  TrainingCheckpoint ckpt;
  std::vector<double> losses;

  // restore_optimizer = false: the file's optimizer state is ignored on load (momentum lost).
  TrainingRun(uint64_t init_seed, uint64_t data_seed, Device device, int hidden = 32, bool restore_optimizer = true)
      : data(data_seed) {
    manual_seed(init_seed);
    model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(8, hidden), std::make_shared<ReLU>(), std::make_shared<Dropout>(0.3),
        std::make_shared<Linear>(hidden, 4)});
    model->to(device);
    optim::SGDOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 1e-3;
    o.nesterov = true;
    opt = std::make_unique<optim::SGD>(model->parameters(), o);
    // Warmup for 3 steps, then cosine: a chained schedule that must resume mid-way.
    auto warmup = std::make_shared<optim::LinearLR>(*opt, 0.25, 1.0, 3);
    auto cosine = std::make_shared<optim::CosineAnnealingLR>(*opt, 8, 1e-3);
    sched = std::make_unique<optim::SequentialLR>(
        *opt, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, cosine}, std::vector<int64_t>{3});
    // Grows the scale every 3 clean steps, so the scale and the growth tracker are mid-cycle at k.
    optim::GradScalerOptions so;
    so.init_scale = 1024;
    so.growth_interval = 3;
    scaler = std::make_unique<optim::GradScaler>(so);
    ckpt.add("model", *model);
    if (restore_optimizer)
      ckpt.add("optimizer", *opt);
    else
      ckpt.add(
          "optimizer", [this] { return opt->state_dict(); }, [](const StateDict&) {});
    ckpt.add("scheduler", *sched).add("scaler", *scaler);
    ckpt.add_generator("rng", default_generator()).add_generator("data", data);
  }

  void train(int steps, Device device) {
    for (int i = 0; i < steps; ++i) {
      Tensor x = randn({16, 8}, {}, &data).to(device);
      Tensor y = randint(0, 4, {16}, {DType::i64}, &data).to(device);
      opt->zero_grad();
      Tensor loss = cross_entropy((*model)(x), y);
      scaler->scale(loss).backward();
      scaler->step(*opt);
      scaler->update();
      sched->step();
      losses.push_back(loss.item());
      ++ckpt.step;
    }
  }

  // Trains `steps` steps on the CPU, saves the checkpoint at `path` and returns the file's bytes.
  std::string train_and_save(int steps, const std::string& path) {
    train(steps, Device::cpu());
    ckpt.save(path);
    return read_file(path);
  }

  std::vector<std::string> weight_bytes() const {
    std::vector<std::string> out;
    for (auto& p : model->parameters()) {
      Tensor c = raw::contiguous(p.cpu());
      out.emplace_back(static_cast<const char*>(c.raw_data()), c.nbytes());
    }
    return out;
  }
};

void resume_is_bit_identical(Device device) {
  const int n = 10, k = 4;
  TrainingRun straight(1, 77, device);
  straight.train(n, device);

  const std::string path = temp_path("resume_" + std::string(device.is_cuda() ? "cuda" : "cpu") + ".ckpt");
  double first_lr_after_k = 0;
  {
    TrainingRun first(1, 77, device);
    first.train(k, device);
    first.ckpt.epoch = 2;
    first.ckpt.extra = {{"best_loss", first.losses.back()}};
    first.ckpt.save(path);
    first_lr_after_k = first.opt->param_groups()[0].lr();
    for (int i = 0; i < k; ++i) EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i;
  }
  // Fresh objects: other init seed, other data seed, the default generator elsewhere.
  TrainingRun resumed(999, 5, device);
  default_generator().manual_seed(424242);
  resumed.ckpt.load(path);
  EXPECT_EQ(resumed.ckpt.step, k);
  EXPECT_EQ(resumed.ckpt.epoch, 2);
  EXPECT_TRUE(resumed.ckpt.extra.contains("best_loss"));
  EXPECT_EQ(resumed.sched->last_epoch(), k);
  EXPECT_EQ(resumed.opt->param_groups()[0].lr(), first_lr_after_k);
  EXPECT_EQ(resumed.scaler->get_scale(), 2048.0);  // grown once, after step 3
  EXPECT_EQ(resumed.scaler->growth_tracker(), 1);
  for (auto& p : resumed.model->parameters()) EXPECT_NE(resumed.opt->state(p), nullptr);  // momentum restored
  resumed.train(n - k, device);
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(n - k));
  for (int i = 0; i < n - k; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[k + i]) << "step " << k + i;
  EXPECT_EQ(resumed.weight_bytes(), straight.weight_bytes());
  EXPECT_EQ(resumed.ckpt.step, n);
}

TEST(TrainingCheckpoint, ResumeIsBitIdenticalOnCpu) { resume_is_bit_identical(Device::cpu()); }

TEST(TrainingCheckpoint, ResumeIsBitIdenticalOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  resume_is_bit_identical(Device::cuda(0));
}

// The test above can only pass if it depends on the restored state: without the dropout stream
// (or with momentum lost) the continuation differs.
TEST(TrainingCheckpoint, ContinuationDependsOnRestoredRngAndMomentum) {
  const std::string path = temp_path("sensitivity.ckpt");
  TrainingRun straight(1, 77, Device::cpu());
  straight.train(6, Device::cpu());
  TrainingRun first(1, 77, Device::cpu());
  first.train(3, Device::cpu());
  first.ckpt.save(path);

  TrainingRun no_rng(1, 77, Device::cpu());
  no_rng.ckpt.load(path);
  default_generator().manual_seed(7);  // the dropout stream is not where it was
  no_rng.train(3, Device::cpu());
  EXPECT_NE(no_rng.weight_bytes(), straight.weight_bytes());

  TrainingRun no_momentum(1, 77, Device::cpu(), 32, /*restore_optimizer=*/false);
  no_momentum.ckpt.load(path);
  no_momentum.train(3, Device::cpu());
  EXPECT_NE(no_momentum.weight_bytes(), straight.weight_bytes());
}

TEST(TrainingCheckpoint, MismatchesAreClearErrors) {
  const std::string path = temp_path("mismatch.ckpt");
  TrainingRun a(1, 77, Device::cpu());
  a.train(2, Device::cpu());
  a.ckpt.save(path);

  // A component the file lacks.
  TrainingRun extra(1, 77, Device::cpu());
  Generator other(3);
  extra.ckpt.add_generator("ema_rng", other);
  try {
    extra.ckpt.load(path);
    ADD_FAILURE() << "loaded a checkpoint lacking a component";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("missing: \"ema_rng\""), std::string::npos) << e.what();
  }

  // A different model: the shape error names the component and the key.
  TrainingRun wider(1, 77, Device::cpu(), /*hidden=*/16);
  try {
    wider.ckpt.load(path);
    ADD_FAILURE() << "loaded weights of another shape";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("component \"model\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("0.weight"), std::string::npos) << msg;
  }

  // A truncated file: IOError naming it, and the model is untouched.
  const std::string bytes = read_file(path);
  const std::string cut = temp_path("cut.ckpt");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  TrainingRun fresh(5, 77, Device::cpu());
  const auto before = fresh.weight_bytes();
  try {
    fresh.ckpt.load(cut);
    ADD_FAILURE() << "loaded a truncated checkpoint";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
  }
  EXPECT_EQ(fresh.weight_bytes(), before);

  // A plain state dict is not a training checkpoint.
  const std::string plain = temp_path("plain.safetensors");
  save(a.model->state_dict(), plain);
  EXPECT_THROW(fresh.ckpt.load(plain), ValueError);

  // Bad registrations.
  TrainingCheckpoint c;
  EXPECT_THROW(c.add_generator("checkpoint", other), ValueError);
  EXPECT_THROW(c.add_generator("a.b", other), ValueError);
  c.add_generator("g", other);
  EXPECT_THROW(c.add_generator("g", other), ValueError);
}

// The model part used to be loaded before the optimizer part raised: a file with a damaged
// optimizer state left the weights overwritten and the momentum stale.
TEST(TrainingCheckpoint, ABadPartLeavesEveryPartUnchanged) {
  TrainingRun a(1, 77, Device::cpu());
  a.train(2, Device::cpu());
  a.ckpt.step = 2;
  const StateDict good = a.ckpt.state_dict();
  TrainingRun b(5, 3, Device::cpu());
  b.train(1, Device::cpu());
  const std::string before = save_to_bytes(b.ckpt.state_dict());
  auto expect_unchanged = [&](const StateDict& bad, const std::string& part) {
    try {
      b.ckpt.load_state_dict(bad);
      ADD_FAILURE() << "accepted a checkpoint with a bad " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_EQ(save_to_bytes(b.ckpt.state_dict()), before) << "a rejected load changed the run (" << part << ")";
  };
  StateDict bad = good;
  bad.tensors.erase("optimizer.state.0.momentum_buffer");
  expect_unchanged(bad, "momentum_buffer");
  bad = good;
  bad.meta["scheduler"]["last_epoch"] = -1;
  expect_unchanged(bad, "component \"scheduler\"");
  bad = good;
  bad.meta["rng"]["seed"] = "x";
  expect_unchanged(bad, "component \"rng\"");
  bad = good;
  bad.meta["checkpoint"]["step"] = -4;
  expect_unchanged(bad, "step -4");
  // A plain load function runs before any staged part commits: when it raises, they are intact.
  b.ckpt.add(
      "plain", [] { return StateDict(); }, [](const StateDict&) { MG_THROW(ValueError, "plain part refuses"); });
  StateDict with_plain = good;
  with_plain.meta["plain"] = nlohmann::json::object();
  with_plain.meta["checkpoint"]["components"].push_back("plain");
  const std::string before_plain = save_to_bytes(b.ckpt.state_dict());
  EXPECT_THROW(b.ckpt.load_state_dict(with_plain), ValueError);
  EXPECT_EQ(save_to_bytes(b.ckpt.state_dict()), before_plain);
}

TEST(TrainingCheckpoint, AFailedSaveKeepsThePreviousCheckpoint) {
  const std::string path = temp_path("keep.ckpt");
  TrainingRun a(1, 77, Device::cpu());
  const std::string before = a.train_and_save(2, path);
  a.ckpt.add(
      "broken", []() -> StateDict { MG_THROW(ValueError, "broken component"); }, [](const StateDict&) {});
  a.train(1, Device::cpu());
  EXPECT_THROW(a.ckpt.save(path), ValueError);
  EXPECT_EQ(read_file(path), before);
  TrainingRun b(9, 1, Device::cpu());
  b.ckpt.load(path);
  EXPECT_EQ(b.ckpt.step, 2);
}

// Damaged checkpoints, mostly in the metadata each component parses (step counts, option values,
// scaler state): loading must end in an mg::Error or succeed, never crash or throw anything else.
TEST(TrainingCheckpoint, FuzzDamagedCheckpointsOnlyRaiseMgErrors) {
  const std::string path = temp_path("fuzz_source.ckpt");
  TrainingRun a(1, 77, Device::cpu());
  const std::string valid = a.train_and_save(3, path);
  uint64_t n;
  std::memcpy(&n, valid.data(), 8);
  const char* env = std::getenv("MG_TEST_SEED");
  std::mt19937_64 rng(env ? std::strtoull(env, nullptr, 10) : 7);
  const char* repl[] = {"0", "-1", "1e308", "\\\"x\\\"", "null", "[]", "{}", "18446744073709551616", "nan", ""};
  TrainingRun b(2, 3, Device::cpu());
  int errors = 0, in_components = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string bytes = valid;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = 8 + rng() % n;
      if (rng() % 2) {
        bytes[at] = "0123456789.-e\"{}[],:"[rng() % 20];
      } else {
        const size_t len = 1 + rng() % 4;
        bytes.replace(at, std::min(len, 8 + n - at), repl[rng() % 10]);
      }
    }
    // Keep the header length consistent with the edited header so the damage reaches the JSON.
    const uint64_t grown = n + (bytes.size() - valid.size());
    std::memcpy(bytes.data(), &grown, 8);
    try {
      b.ckpt.load_state_dict(load_from_bytes(bytes, Device::cpu(), "fuzz.ckpt"));
    } catch (const Error& e) {
      ++errors;
      in_components += std::string(e.what()).find("component \"") != std::string::npos;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-mg exception " << e.what();
    }
  }
  std::cout << errors << " rejected, " << in_components << " of them by a component's own checks\n";
  EXPECT_GT(errors, 750);
  EXPECT_GT(in_components, 0);  // the damage reaches the components' loaders, not just the file checks
}

}  // namespace
}  // namespace mg::nn
