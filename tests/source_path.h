// Where a test finds a file of the source tree: under $MG_SOURCE_ROOT (a staged binary;
// tools/run_staged.sh sets it to the repository), in Bazel's runfiles, or relative to the
// working directory.
#pragma once

#include <cstdlib>
#include <string>

namespace mg::test {

inline std::string source_path(const std::string& rel) {
  if (const char* root = std::getenv("MG_SOURCE_ROOT")) return std::string(root) + "/" + rel;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* ws = std::getenv("TEST_WORKSPACE");
    return std::string(srcdir) + "/" + (ws ? ws : "memgrad") + "/" + rel;
  }
  return rel;
}

}  // namespace mg::test
