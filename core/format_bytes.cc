#include "core/format_bytes.h"

#include <cstdio>

namespace mg {

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string format_bytes(int64_t bytes) {
  // The magnitude in unsigned arithmetic: -INT64_MIN does not exist as an int64_t.
  if (bytes >= 0) return format_bytes(static_cast<uint64_t>(bytes));
  return "-" + format_bytes(uint64_t{0} - static_cast<uint64_t>(bytes));
}

}  // namespace mg
