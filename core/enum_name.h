// enum_name: an enum value's name from a table in the enum's order, the one way memgrad's
// enum-to-string functions (dtype_name, reduce_op_name, to_string(TraceAction), ...) are written;
// enum_lookup: the same for any per-value table (a library's type enum per DType).
#pragma once

#include <cstddef>

namespace mg {

// names[i] is the name of the value first + i; "?" for a value outside the table.
template <class E, size_t N>
constexpr const char* enum_name(E value, const char* const (&names)[N], int first = 0) {
  const auto i = static_cast<size_t>(static_cast<int>(value) - first);
  return i < N ? names[i] : "?";
}

// table[i] is what the value first + i maps to (e.g. a library's type enum per DType, in
// DType's order); null for a value outside the table.
template <class E, class T, size_t N>
constexpr const T* enum_lookup(E value, const T (&table)[N], int first = 0) {
  const auto i = static_cast<size_t>(static_cast<int>(value) - first);
  return i < N ? &table[i] : nullptr;
}

}  // namespace mg
