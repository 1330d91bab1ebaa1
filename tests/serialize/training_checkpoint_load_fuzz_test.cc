// Loading damaged training checkpoints, all or nothing (training_checkpoint_fuzz_test covers the
// file format itself): a model, fused Adam, an LR schedule, a GradScaler and a generator are
// saved, then 500 seeded mutations of their state are loaded (MG_TEST_SEED picks another
// sequence). A rejected load must leave every part bit-identical (TrainingCheckpoint used to
// overwrite the weights before the optimizer part raised); an accepted one must give an optimizer
// whose next step keeps the parameters finite (exp_avg without exp_avg_sq, or step -5, used to
// crash or poison it).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "serialize/training_checkpoint.h"
#include "tests/serialize/training_run.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test
namespace {

// JSON values a mutation writes into the meta: wrong types, out-of-range and legal numbers.
// (No huge finite numbers: lr = 1e30 is a legal setting that overflows any optimizer.)
const std::vector<nlohmann::json> kValues = {-5,
                                             -1,
                                             0,
                                             0.5,
                                             1,
                                             2,
                                             3.5,
                                             std::numeric_limits<double>::infinity(),
                                             std::numeric_limits<double>::quiet_NaN(),
                                             "x",
                                             nullptr,
                                             true,
                                             nlohmann::json::array(),
                                             nlohmann::json::object(),
                                             std::numeric_limits<uint64_t>::max(),
                                             std::numeric_limits<int64_t>::min()};
const std::vector<std::string> kBufferNames = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "x"};

template <class V>
auto& pick(std::mt19937_64& rng, V& v) {
  return *std::next(v.begin(), static_cast<std::ptrdiff_t>(rng() % v.size()));
}

using Pointer = nlohmann::json::json_pointer;

// Every value in `j` (containers included) below the root, as JSON pointers.
void collect(const nlohmann::json& j, const Pointer& at, std::vector<Pointer>& out) {
  if (!at.empty()) out.push_back(at);
  if (j.is_object())
    for (auto& [k, v] : j.items()) collect(v, at / k, out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) collect(j[i], at / i, out);
}

// One structural or value mutation of the state dict.
void mutate(StateDict& sd, std::mt19937_64& rng) {
  std::vector<Pointer> entries;
  collect(sd.meta, Pointer(), entries);
  switch (rng() % 6) {
    case 0:  // a meta value (step, option, counter, seed, header field, a whole group) changes
      sd.meta[pick(rng, entries)] = pick(rng, kValues);
      break;
    case 1: {  // a meta entry disappears
      const Pointer at = pick(rng, entries);
      nlohmann::json& parent = sd.meta[at.parent_pointer()];
      if (parent.is_object())
        parent.erase(at.back());
      else
        parent.erase(static_cast<size_t>(std::stoul(at.back())));
      break;
    }
    case 2:  // a tensor disappears
      sd.tensors.erase(std::next(sd.tensors.begin(), static_cast<std::ptrdiff_t>(rng() % sd.tensors.size())));
      break;
    case 3: {  // a tensor is renamed (another buffer name, or another parameter's index)
      auto it = std::next(sd.tensors.begin(), static_cast<std::ptrdiff_t>(rng() % sd.tensors.size()));
      std::string name = it->first;
      if (name.rfind("optimizer.state.", 0) == 0 && rng() % 2)
        name = name.substr(0, name.rfind('.') + 1) + pick(rng, kBufferNames);
      else
        name = name.substr(0, name.size() - 1) + std::to_string(rng() % 5);
      Tensor t = it->second;
      sd.tensors.erase(it);
      sd.tensors[name] = t;
      break;
    }
    case 4: {  // a tensor of another shape or dtype
      auto it = std::next(sd.tensors.begin(), static_cast<std::ptrdiff_t>(rng() % sd.tensors.size()));
      const DType dtypes[] = {DType::f64, DType::f16, DType::i64, DType::u8};
      if (rng() % 2) {
        Shape s = it->second.sizes();
        if (s.empty() || rng() % 2)
          s.push_back(2);
        else
          s.back() += 1;
        it->second = zeros(s);
      } else {
        it->second = it->second.to(dtypes[rng() % 4]);
      }
      break;
    }
    default: {  // an optimizer buffer element turns non-finite or negative (weights stay data)
      std::vector<std::string> names;
      for (auto& [k, t] : sd.tensors)
        if (k.rfind("optimizer.state.", 0) == 0) names.push_back(k);
      if (names.empty()) break;
      const std::string& name = pick(rng, names);
      Tensor t = sd.tensors[name].clone();
      const float values[] = {std::nanf(""), INFINITY, -1.0f, -1e-30f};
      t.data_ptr<float>()[rng() % t.numel()] = values[rng() % 4];
      sd.tensors[name] = t;
    }
  }
}

// Damage in the file itself (the header JSON), as a byte editor or a bad disk would do it.
std::string damage_bytes(std::string bytes, std::mt19937_64& rng) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  const size_t size = bytes.size();
  const char* repl[] = {"0", "-1", "1e400", "\\\"x\\\"", "null", "[]", "{}", "99999", "nan", ""};
  const size_t at = 8 + rng() % n;
  if (rng() % 2)
    bytes[at] = "0123456789.-e\"{}[],:"[rng() % 20];
  else
    bytes.replace(at, std::min<size_t>(1 + rng() % 4, 8 + n - at), repl[rng() % 10]);
  const uint64_t grown = n + bytes.size() - size;  // keep the header length consistent
  std::memcpy(bytes.data(), &grown, 8);
  return bytes;
}

TEST(TrainingCheckpointFuzz, RejectedLoadsChangeNothingAcceptedOnesStepFinitely) {
  const auto start = std::chrono::steady_clock::now();
  TrainingRun source(1);
  for (int i = 0; i < 3; ++i) source.step(100 + i);
  source.ckpt.step = 3;
  source.ckpt.extra = {{"best_loss", 0.25}};
  const StateDict valid = source.ckpt.state_dict();
  const std::string valid_bytes = save_to_bytes(valid);

  const char* env = std::getenv("MG_TEST_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : 13;
  std::mt19937_64 rng(seed);
  TrainingRun target(2);
  target.step(7);
  int rejected = 0, accepted = 0, by_components = 0;
  for (int iter = 0; iter < 500; ++iter) {
    SCOPED_TRACE("seed " + std::to_string(seed) + ", iteration " + std::to_string(iter));
    std::string bytes;
    if (iter % 4 == 3) {
      bytes = damage_bytes(valid_bytes, rng);
    } else {
      StateDict sd = valid;
      const int edits = 1 + static_cast<int>(rng() % 2);
      for (int e = 0; e < edits; ++e) mutate(sd, rng);
      bytes = save_to_bytes(sd);
    }
    const std::string before = target.snapshot();
    try {
      target.ckpt.load_state_dict(load_from_bytes(bytes, Device::cpu(), "fuzz.ckpt"));
    } catch (const Error& e) {
      ++rejected;
      by_components += std::string(e.what()).find("component \"") != std::string::npos;
      ASSERT_EQ(target.snapshot(), before) << "a rejected load changed the run: " << e.what();
      continue;
    } catch (const std::exception& e) {
      FAIL() << "non-mg exception " << e.what();
    }
    ++accepted;
    target.step(1000 + iter);
    ASSERT_TRUE(target.parameters_finite()) << "an accepted checkpoint stepped to non-finite parameters";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "fuzz seed " << seed << ": " << rejected << " rejected (" << by_components << " by a component), "
            << accepted << " accepted, " << seconds << " s\n";
  // Most mutations break something a check must see; some (a legal lr, a renamed weight of a
  // model that then misses it...) still load. Both paths must have run.
  EXPECT_GT(rejected, 250);
  EXPECT_GT(by_components, 100);
  EXPECT_GT(accepted, 10);
}

}  // namespace
}  // namespace mg::nn
