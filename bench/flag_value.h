// Command-line values for the bench binaries' hand-rolled flag loops.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace mg::bench {

// The value after the flag argv[i] (i moves onto it). Without one: "<program>: <flag> needs a
// value" on stderr and exit status 2, as for any other usage error.
inline std::string flag_value(const char* program, int argc, char** argv, int& i) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s: %s needs a value\n", program, argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

}  // namespace mg::bench
