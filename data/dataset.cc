#include "data/dataset.h"

#include "kernels/ops.h"

namespace mg::data {

Example Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (int64_t i : indices) examples.push_back(get(i));
  return collate_stack(examples);
}

Example collate_stack(const std::vector<Example>& examples) {
  MG_CHECK(!examples.empty(), ValueError, "collate_stack: no examples to collate");
  std::vector<Tensor> data, target;
  data.reserve(examples.size());
  target.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    MG_CHECK(e.data.defined(), ValueError, "collate_stack: example ", i, " has no data");
    MG_CHECK(e.data.sizes() == examples[0].data.sizes(), ShapeError, "collate_stack: example ", i, " has data shape ",
             shape_str(e.data.sizes()), " but example 0 has ", shape_str(examples[0].data.sizes()));
    data.push_back(e.data);
    if (e.target.defined()) target.push_back(e.target);
  }
  MG_CHECK(target.empty() || target.size() == examples.size(), ValueError,
           "collate_stack: some examples have a target and some do not");
  Example out;
  out.data = kernels::stack(data, 0);
  if (!target.empty()) out.target = kernels::stack(target, 0);
  return out;
}

TensorDataset::TensorDataset(Tensor data, Tensor targets) : data_(std::move(data)), targets_(std::move(targets)) {
  MG_CHECK(data_.defined() && data_.dim() >= 1, ValueError, "TensorDataset: data must be a tensor with at least 1 dim");
  MG_CHECK(!targets_.defined() || (targets_.dim() >= 1 && targets_.size(0) == data_.size(0)), ShapeError,
           "TensorDataset: data has ", data_.size(0), " rows but targets have shape ",
           targets_.defined() ? shape_str(targets_.sizes()) : std::string("?"));
}

Example TensorDataset::get(int64_t index) const {
  MG_CHECK(index >= 0 && index < size(), IndexError, "TensorDataset::get: index ", index, " out of range [0, ", size(),
           ")");
  Example e;
  e.data = raw::select(data_, 0, index);
  if (targets_.defined()) e.target = raw::select(targets_, 0, index);
  return e;
}

Example TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices)
    MG_CHECK(i >= 0 && i < size(), IndexError, "TensorDataset::get_batch: index ", i, " out of range [0, ", size(),
             ")");
  Tensor idx = from_vector(indices, {static_cast<int64_t>(indices.size())}, {DType::i64, data_.device()});
  Example e;
  e.data = kernels::index_select(data_, 0, idx);
  if (targets_.defined()) e.target = kernels::index_select(targets_, 0, idx);
  return e;
}

}  // namespace mg::data
