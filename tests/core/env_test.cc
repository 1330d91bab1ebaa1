// The MG_* switch table (core/env.cc) against docs/environment.md, and the errors of a bad switch.
#include "core/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "core/error.h"
#include "tests/source_path.h"

namespace mg {
namespace {

TEST(Env, DocsPageListsExactlyTheTable) {
  std::ifstream in(test::source_path("docs/environment.md"));
  ASSERT_TRUE(in) << "docs/environment.md not found";
  // Rows of the page's table: | `NAME` | default | effect |
  const std::regex row(R"(^\| `(MG_[A-Z0-9_]+)` \| (.*) \| (.*) \|$)");
  std::map<std::string, std::pair<std::string, std::string>> page;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, row)) page[m[1]] = {m[2], m[3]};
  }
  ASSERT_EQ(page.size(), env::switches().size()) << "the page and core/env.cc list different switches";
  for (const env::Switch& s : env::switches()) {
    ASSERT_TRUE(page.count(s.name)) << s.name << " is in core/env.cc but not in docs/environment.md";
    EXPECT_EQ(page[s.name].first, s.default_value) << s.name;
    EXPECT_EQ(page[s.name].second, s.effect) << s.name;
  }
}

TEST(Env, UnknownSwitchAndBadValuesAreErrors) {
  EXPECT_THROW(env::get("MG_NOT_A_SWITCH"), ValueError);
  ::setenv("MG_DEPTHWISE_NHWC", "2", 1);
  try {
    env::choice("MG_DEPTHWISE_NHWC", {"auto", "0", "1"});
    ADD_FAILURE() << "no error for MG_DEPTHWISE_NHWC=2";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("env: MG_DEPTHWISE_NHWC must be auto, 0 or 1, got '2'"), std::string::npos)
        << e.what();
  }
  ::setenv("MG_DEPTHWISE_NHWC", "1", 1);
  EXPECT_EQ(env::choice("MG_DEPTHWISE_NHWC", {"auto", "0", "1"}), "1");
  ::unsetenv("MG_DEPTHWISE_NHWC");
  EXPECT_EQ(env::choice("MG_DEPTHWISE_NHWC", {"auto", "0", "1"}), "auto");  // unset: the first choice
  ::setenv("MG_CUBLAS_WORKSPACE_MB", "12x", 1);
  EXPECT_THROW(env::integer("MG_CUBLAS_WORKSPACE_MB", 32), ValueError);
  ::setenv("MG_CUBLAS_WORKSPACE_MB", "", 1);  // empty counts as unset
  EXPECT_EQ(env::integer("MG_CUBLAS_WORKSPACE_MB", 32), 32);
  ::unsetenv("MG_CUBLAS_WORKSPACE_MB");
}

}  // namespace
}  // namespace mg
