// Byte counts for people: the one formatter every memory message, table and report uses
// (OOM errors, memory_summary, the caching allocator's snapshots).
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>

namespace mg {

// "512 B", "1.50 KiB", "20.00 MiB", "8.00 EiB": byte counts in every message and table. A
// signed count (a delta, a stat that dipped below zero) prints with a leading '-'.
std::string format_bytes(uint64_t bytes);
std::string format_bytes(int64_t bytes);
// Other integer types (int, long long, size_t spelled differently) pick the overload by sign.
template <std::integral T>
requires(!std::is_same_v<T, int64_t> && !std::is_same_v<T, uint64_t>) std::string format_bytes(T bytes) {
  if constexpr (std::is_signed_v<T>)
    return format_bytes(static_cast<int64_t>(bytes));
  else
    return format_bytes(static_cast<uint64_t>(bytes));
}

}  // namespace mg
