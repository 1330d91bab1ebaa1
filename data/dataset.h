// Datasets: an indexable collection of Examples (input + target). TensorDataset wraps two
// in-memory tensors and can gather a whole batch with one index_select per tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mg::data {

struct Example {
  Tensor data;
  Tensor target;
};

// Implementations must allow concurrent get()/get_batch() calls (DataLoader worker threads
// will call them from several threads).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // The examples at `indices`, collated into one batch. Default: get() each and stack.
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
};

// Stacks the examples' data and targets along a new dim 0 ([B, ...]); all must agree in
// shape and dtype (mg::ShapeError otherwise).
Example collate_stack(const std::vector<Example>& examples);

class TensorDataset : public Dataset {
 public:
  // Row i of `data` and of `targets` form example i; both need the same size(0).
  TensorDataset(Tensor data, Tensor targets);
  int64_t size() const override { return data_.size(0); }
  // Views of row `index` (no copy).
  Example get(int64_t index) const override;
  // One kernels::index_select per tensor: contiguous [B, ...] copies.
  Example get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
};

}  // namespace mg::data
