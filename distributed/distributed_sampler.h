// DistributedSampler: each rank's share of a dataset's indices for one epoch (torch's
// DistributedSampler: shuffle from seed + epoch, pad by repeating or drop the tail so every
// rank gets the same number), and a Dataset view of that share to hand to a DataLoader.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"

namespace mg::dist {

struct DistributedSamplerOptions {
  int64_t num_replicas = 1;  // world size
  int64_t rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;  // the same on every rank
  // false: pad with the first indices so every rank gets ceil(N / R) samples;
  // true: drop the tail so every rank gets floor(N / R).
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions opts);
  // Reshuffles for `epoch` (call at the start of every epoch, with the same value on every rank).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch: positions rank, rank + R, rank + 2R, ... of the
  // (shuffled, padded or truncated) global order.
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }  // per rank
  int64_t total_size() const { return num_samples_ * opts_.num_replicas; }
  const DistributedSamplerOptions& options() const { return opts_; }

 private:
  int64_t size_;
  DistributedSamplerOptions opts_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

// The rank's share as a Dataset (index i = the sampler's i-th index). Call refresh() after
// set_epoch() and before the DataLoader starts the epoch (the loader should not shuffle again).
class DistributedShard : public data::Dataset {
 public:
  DistributedShard(std::shared_ptr<const data::Dataset> dataset, std::shared_ptr<const DistributedSampler> sampler);
  void refresh();
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  data::Example get(int64_t index) const override;
  data::Example get_batch(const std::vector<int64_t>& indices) const override;
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  std::shared_ptr<const data::Dataset> dataset_;
  std::shared_ptr<const DistributedSampler> sampler_;
  std::vector<int64_t> indices_;
};

}  // namespace mg::dist
