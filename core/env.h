// Every MG_* environment switch memgrad reads, in one table (core/env.cc) with its default and
// effect; docs/environment.md shows the same table, and a test checks that the two agree.
#pragma once

#include <initializer_list>
#include <string_view>
#include <vector>

namespace mg::env {

struct Switch {
  const char* name;
  const char* default_value;  // what an unset variable means
  const char* effect;
};

// The table, in the order docs/environment.md lists it.
const std::vector<Switch>& switches();

// The variable's value, or nullptr when it is unset or empty. `name` must be in the table: a
// switch read anywhere else is a programming error (mg::ValueError), so the table stays whole.
const char* get(const char* name);

// get(name) as one of `choices`, the first when unset; any other value is an mg::ValueError
// naming the variable and the choices.
std::string_view choice(const char* name, std::initializer_list<std::string_view> choices);

// get(name) as an integer, `fallback` when unset; a value that is not an integer is an
// mg::ValueError.
long integer(const char* name, long fallback);

}  // namespace mg::env
