// Seeded, bounded fuzzing of the safetensors loader (CI): a valid file of every dtype (scalar,
// empty and BOOL tensors among them) damaged at the byte level and in its JSON header (huge
// declared sizes, overlapping and out-of-range offsets, bad JSON, wrong field types; see
// safetensors_mutations.h). Every input must load a state dict that saves and loads back to
// itself, or raise mg::Error; never crash, hang (1 s per input) or raise peak RSS by 256 MiB.
// Through memory (load_from_bytes) and, every 25th input, a file (load). MG_TEST_SEED varies it.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>

#include "serialize/serialize.h"
#include "core/random.h"
#include "tests/serialize/all_dtypes.h"
#include "tests/serialize/safetensors_mutations.h"
#include "tests/fuzz.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test
namespace {

std::string temp_file(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

// What an accepted load must be: whole tensors that survive another save / load unchanged.
void expect_valid(const StateDict& sd, const std::string& what) {
  for (auto& [k, t] : sd.tensors) {
    // (Tensor::is_contiguous is false for a fresh [0, 0] tensor, unlike PyTorch's; numel 0 is
    // whole either way.)
    ASSERT_TRUE(t.defined() && (t.numel() == 0 || t.is_contiguous()))
        << what << ": " << k << " " << shape_str(t.sizes());
    ASSERT_EQ(t.nbytes(), static_cast<size_t>(t.numel()) * t.element_size()) << what << ": " << k;
  }
  const std::string again = save_to_bytes(sd);
  EXPECT_EQ(save_to_bytes(load_from_bytes(again)), again) << what;
}

TEST(SafetensorsFuzz, DamagedFilesLoadOrRaiseMgError) {
  const uint64_t seed = mg::testing::fuzz_seed(20261129);
  mg::testing::Mutator m(seed);
  manual_seed(5);
  const std::string valid = save_to_bytes(all_dtypes());
  const std::string path = temp_file("fuzz.safetensors");
  std::string input;
  auto one_case = [&](int it) {
    input = mutate_safetensors(valid, m);
    StateDict sd;
    if (it % 25 == 0) {
      std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
      sd = load(path);
    } else {
      sd = load_from_bytes(input, Device::cpu(), "fuzz");
    }
    expect_valid(sd, "iteration " + std::to_string(it));
  };
  mg::testing::FuzzLimits lim;
  lim.iterations = 5000;
  const mg::testing::FuzzCounts c = mg::testing::run_fuzz(lim, one_case, [&](int it) {
    return "seed " + std::to_string(seed) + " iteration " + std::to_string(it) + " (" + std::to_string(input.size()) +
           "-byte input, header " + input.substr(8, 200) + ")";
  });
  std::cout << "safetensors fuzz seed " << seed << ": " << c.rejected << " rejected, " << c.loaded << " loaded\n";
  EXPECT_GT(c.rejected, c.loaded);        // most damage is caught
  EXPECT_GT(c.rejected + c.loaded, 200);  // the loop ran (fewer inputs fit the time budget under ASan)
}

}  // namespace
}  // namespace mg::nn
