// enum_name: an enum value's name from a table in the enum's order, the one way memgrad's
// enum-to-string functions (dtype_name, reduce_op_name, to_string(TraceAction), ...) are written.
#pragma once

#include <cstddef>

namespace mg {

// names[i] is the name of the value first + i; "?" for a value outside the table.
template <class E, size_t N>
constexpr const char* enum_name(E value, const char* const (&names)[N], int first = 0) {
  const auto i = static_cast<size_t>(static_cast<int>(value) - first);
  return i < N ? names[i] : "?";
}

}  // namespace mg
