// Raw indexing: one_hot, gather, scatter(_add), index_select, index_add, cat, stack. Index
// tensors are bounds-checked; a bad index raises mg::IndexError naming the op and the value.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- indexing ----
// one_hot(i64 indices, C) -> i64 [..., C]; raises IndexError for labels outside [0, C).
Tensor one_hot(const Tensor& indices, int64_t num_classes);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
void scatter_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// IndexBounds::Checked: the caller has already checked `index` against self's size along dim
// (the embedding backward: its forward's index_select checked the same saved indices), so CUDA
// skips its own check, a device-to-host copy that synchronizes the stream and drained the GPU
// at the end of GPT-2's backward. The CPU checks either way.
enum class IndexBounds { Check, Checked };
void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                IndexBounds bounds = IndexBounds::Check);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim);

}  // namespace mg::kernels
