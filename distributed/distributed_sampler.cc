// The index arithmetic of torch.utils.data.DistributedSampler, over memgrad's randperm.
#include "distributed/distributed_sampler.h"

#include "core/random.h"

namespace mg::dist {

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions opts)
    : size_(dataset_size), opts_(opts) {
  MG_CHECK(dataset_size >= 0, ValueError, "DistributedSampler: dataset size must be >= 0, got ", dataset_size);
  MG_CHECK(opts.num_replicas >= 1, ValueError, "DistributedSampler: num_replicas must be >= 1, got ",
           opts.num_replicas);
  MG_CHECK(opts.rank >= 0 && opts.rank < opts.num_replicas, ValueError, "DistributedSampler: invalid rank ", opts.rank,
           ", rank should be in the interval [0, ", opts.num_replicas - 1, "]");
  const int64_t R = opts.num_replicas;
  // torch: drop_last -> ceil((N - R) / R) = floor(N / R); otherwise ceil(N / R) (the tail is padded).
  num_samples_ = opts.drop_last ? size_ / R : (size_ + R - 1) / R;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(size_);
  if (opts_.shuffle) {
    Generator g(opts_.seed + static_cast<uint64_t>(epoch_));
    order = randperm(size_, &g).to_vector<int64_t>();
  } else {
    for (int64_t i = 0; i < size_; ++i) order[i] = i;
  }
  const int64_t total = total_size();
  if (!opts_.drop_last && total > size_ && size_ > 0) {
    // Pad by repeating the order from its start (several times if the dataset is tiny).
    const int64_t pad = total - size_;
    for (int64_t k = 0; k < pad; ++k) order.push_back(order[k % size_]);
  } else {
    order.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = opts_.rank; i < total; i += opts_.num_replicas) mine.push_back(order[i]);
  return mine;
}

DistributedShard::DistributedShard(std::shared_ptr<const data::Dataset> dataset,
                                   std::shared_ptr<const DistributedSampler> sampler)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)) {
  MG_CHECK(dataset_ && sampler_, ValueError, "DistributedShard: dataset and sampler must be set");
  refresh();
}

void DistributedShard::refresh() { indices_ = sampler_->indices(); }

data::Example DistributedShard::get(int64_t index) const {
  MG_CHECK(index >= 0 && index < size(), IndexError, "DistributedShard: index ", index, " out of range [0, ", size(),
           ")");
  return dataset_->get(indices_[index]);
}

data::Example DistributedShard::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<int64_t> mapped;
  mapped.reserve(indices.size());
  for (int64_t i : indices) {
    MG_CHECK(i >= 0 && i < size(), IndexError, "DistributedShard: index ", i, " out of range [0, ", size(), ")");
    mapped.push_back(indices_[i]);
  }
  return dataset_->get_batch(mapped);
}

}  // namespace mg::dist
