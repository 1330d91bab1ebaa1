// Seeded, bounded fuzzing of the training-checkpoint file format (CI): a checkpoint of a model,
// an Adam optimizer with state, a scheduler, a GradScaler and a generator, damaged at the byte
// level, in the safetensors header (safetensors_mutations.h), and in the memgrad.meta document
// each component parses (values replaced by hostile ones, keys deleted). Every input must load
// (the model then runs and the checkpoint saves again) or raise mg::Error; never crash, hang
// (1 s per input) or raise peak RSS by 256 MiB. Through memory, and every 25th input a file.
// (What the optimizer does with an accepted state when it steps is training_checkpoint_test's.)
// MG_TEST_SEED varies it.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "serialize/training_checkpoint.h"
#include "core/random.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "tests/serialize/safetensors_mutations.h"
#include "tests/serialize/training_run.h"
#include "tests/fuzz.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test
namespace {

using nlohmann::json;

std::string temp_file(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

// Every leaf of `j` as a JSON pointer.
void leaves(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>* out) {
  if (j.is_object() && !j.empty()) {
    for (auto& [k, v] : j.items()) leaves(v, at / k, out);
  } else if (j.is_array() && !j.empty()) {
    for (size_t i = 0; i < j.size(); ++i) leaves(j[i], at / i, out);
  } else {
    out->push_back(at);
  }
}

// Replaces or deletes one value of the memgrad.meta document inside the safetensors header.
std::string mutate_meta(const std::string& valid, mg::testing::Mutator& m) {
  mg::testing::SafetensorsParts p;
  if (!mg::testing::split_safetensors(valid, &p)) return valid;
  json h = json::parse(p.header);
  json meta = json::parse(h["__metadata__"]["memgrad.meta"].get<std::string>());
  const int edits = 1 + static_cast<int>(m.below(3));
  for (int e = 0; e < edits; ++e) {
    std::vector<json::json_pointer> all;
    leaves(meta, json::json_pointer(), &all);
    const json::json_pointer at = all[m.below(all.size())];
    // Sometimes the parent object or array as a whole, so whole sections go missing or change type.
    const json::json_pointer target = (m.below(4) == 0 && !at.empty()) ? at.parent_pointer() : at;
    if (target.empty()) continue;
    if (m.below(4) == 0) {
      json& parent = meta[target.parent_pointer()];
      if (parent.is_object())
        parent.erase(target.back());
      else
        parent.erase(static_cast<size_t>(std::stoul(target.back())));
    } else {
      meta[target] = mg::testing::hostile_value(m);
    }
  }
  h["__metadata__"]["memgrad.meta"] = meta.dump();
  return mg::testing::join_safetensors(h.dump(), p.data);
}

TEST(TrainingCheckpointFuzz, DamagedCheckpointsLoadOrRaiseMgError) {
  const uint64_t seed = mg::testing::fuzz_seed(20261202);
  mg::testing::Mutator m(seed);
  TrainingRun a(1);
  for (uint64_t s = 0; s < 3; ++s) a.step(100 + s);
  const std::string valid = save_to_bytes(a.ckpt.state_dict());
  TrainingRun b(2);
  const std::string path = temp_file("fuzz.ckpt");
  const Tensor x = randn({2, 4});
  std::string input;
  int meta_cases = 0;
  auto one_case = [&](int it) {
    const bool meta = m.below(2) == 0;
    meta_cases += meta;
    input = meta ? mutate_meta(valid, m) : mutate_safetensors(valid, m);
    if (it % 25 == 0) {
      std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
      b.ckpt.load(path);
    } else {
      b.ckpt.load_state_dict(load_from_bytes(input, Device::cpu(), "fuzz.ckpt"));
    }
    // Accepted: the model runs, and the whole checkpoint saves and reads back.
    {
      NoGradGuard ng;
      EXPECT_EQ(b.model->forward(x).sizes(), (Shape{2, 3}));
    }
    b.ckpt.load_state_dict(load_from_bytes(save_to_bytes(b.ckpt.state_dict())));
  };
  mg::testing::FuzzLimits lim;
  lim.iterations = 3000;
  const mg::testing::FuzzCounts c = mg::testing::run_fuzz(lim, one_case, [&](int it) {
    return "seed " + std::to_string(seed) + " iteration " + std::to_string(it) + " (" + std::to_string(input.size()) +
           "-byte input)";
  });
  std::cout << "training checkpoint fuzz seed " << seed << ": " << c.rejected << " rejected, " << c.loaded
            << " loaded, " << meta_cases << " of the inputs damaged in memgrad.meta\n";
  EXPECT_GT(c.rejected, c.loaded);
  EXPECT_GT(c.rejected + c.loaded, 100);  // the loop ran (fewer inputs fit the time budget under ASan)
}

}  // namespace
}  // namespace mg::nn
