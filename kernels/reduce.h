// Raw reductions: sum, mean, var, max/min with indices, sum_to (the reverse of broadcasting),
// sum of squares and the non-finite check.
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- reductions (dims may be negative; empty dims = all) ----
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// sum of floating data written in `dtype`: a's own, or f32 for f16/bf16 data, whose f32 sums are
// then kept as they are (torch.sum(a, dtype=torch.float32)) instead of rounded to a's type.
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, DType dtype);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Values and i64 indices of the max along one dim.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max_all(const Tensor& a);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (the reverse of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& shape);
// Sum of squares of all elements as an f32/f64 scalar tensor (norms, clipping).
Tensor sum_squares(const Tensor& a);
// True if any element is inf or NaN.
bool has_nonfinite(const Tensor& a);

}  // namespace mg::kernels
