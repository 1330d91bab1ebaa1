// The one strided iteration helper on the CPU: walks N operands of the same (broadcast)
// shape row by row, after merging dimensions that are contiguous in every operand.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace mg {

// Calls f(offsets, inner_strides, n) once per innermost row, where offsets[i] is operand
// i's element offset at the row start and inner_strides[i] its stride along the row.
template <size_t N, class F>
void strided_loop(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, N>& strides, F&& f) {
  // Merge dims (from the innermost outward) where every operand is contiguous across them.
  std::vector<int64_t> sz;
  std::array<std::vector<int64_t>, N> st;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (!sz.empty()) {
      bool merge = true;
      for (size_t i = 0; i < N; ++i)
        if (strides[i][d] != st[i].back() * sz.back()) merge = false;
      if (merge) {
        sz.back() *= shape[d];
        continue;
      }
    }
    sz.push_back(shape[d]);
    for (size_t i = 0; i < N; ++i) st[i].push_back(strides[i][d]);
  }
  for (int64_t s : shape)
    if (s == 0) return;
  std::array<int64_t, N> off{};
  std::array<int64_t, N> inner{};
  if (sz.empty()) {
    f(off, inner, int64_t{1});
    return;
  }
  // sz/st are innermost-first now.
  const size_t nd = sz.size();
  for (size_t i = 0; i < N; ++i) inner[i] = st[i][0];
  const int64_t n = sz[0];
  std::vector<int64_t> idx(nd, 0);
  while (true) {
    f(off, inner, n);
    size_t d = 1;
    for (; d < nd; ++d) {
      ++idx[d];
      for (size_t i = 0; i < N; ++i) off[i] += st[i][d];
      if (idx[d] < sz[d]) break;
      for (size_t i = 0; i < N; ++i) off[i] -= st[i][d] * sz[d];
      idx[d] = 0;
    }
    if (d >= nd) return;
  }
}

}  // namespace mg
