// The message of the error a call raises, for tests that check what an error says.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace mg::testing {

// Runs f and returns the message of the E it threw; fails the test (and returns "") when it
// threw nothing. Another exception type propagates, failing the test with its own message.
template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace mg::testing
