#include "data/dataloader.h"

#include <numeric>

namespace mg::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions opts)
    : dataset_(std::move(dataset)), opts_(opts), own_gen_(opts.seed) {
  MG_CHECK(dataset_ != nullptr, ValueError, "DataLoader: null dataset");
  MG_CHECK(opts_.batch_size >= 1, ValueError, "DataLoader: batch_size must be >= 1, got ", opts_.batch_size);
  MG_CHECK(opts_.num_workers == 0, ValueError, "DataLoader: num_workers = ", opts_.num_workers,
           " is not supported yet (batches are loaded on the calling thread); use 0");
  MG_CHECK(!opts_.pin_memory, ValueError, "DataLoader: pin_memory is not supported yet");
  order_.resize(static_cast<size_t>(dataset_->size()));
  std::iota(order_.begin(), order_.end(), 0);
}

int64_t DataLoader::size() const {
  const int64_t n = dataset_->size(), b = opts_.batch_size;
  return opts_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> DataLoader::batch_indices(int64_t b) const {
  MG_CHECK(b >= 0 && b < size(), IndexError, "DataLoader: batch ", b, " out of range [0, ", size(), ")");
  const int64_t start = b * opts_.batch_size;
  const int64_t stop = std::min<int64_t>(start + opts_.batch_size, static_cast<int64_t>(order_.size()));
  return std::vector<int64_t>(order_.begin() + start, order_.begin() + stop);
}

Example DataLoader::fetch(int64_t b) const {
  MemoryCategoryGuard g(MemoryCategory::Data);
  return dataset_->get_batch(batch_indices(b));
}

DataLoader::Iterator DataLoader::begin() {
  const int64_t n = dataset_->size();
  MG_CHECK(static_cast<int64_t>(order_.size()) == n, ValueError, "DataLoader: the dataset changed size from ",
           order_.size(), " to ", n);
  if (opts_.shuffle) {
    MemoryCategoryGuard g(MemoryCategory::Data);  // the sampler's permutation is data too
    Tensor perm = randperm(n, opts_.generator ? opts_.generator : &own_gen_);
    const int64_t* p = perm.data_ptr<int64_t>();
    order_.assign(p, p + n);
  }
  ++epoch_;
  return Iterator(this, 0);
}

DataLoader::Iterator DataLoader::end() { return Iterator(nullptr, size()); }

DataLoader::Iterator::Iterator(DataLoader* loader, int64_t batch) : loader_(loader), batch_(batch) {
  if (loader_ && batch_ < loader_->size()) current_ = loader_->fetch(batch_);
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++batch_;
  // Release the previous batch before loading the next, so only one is alive at a time.
  current_ = Example();
  if (loader_ && batch_ < loader_->size()) current_ = loader_->fetch(batch_);
  return *this;
}

}  // namespace mg::data
