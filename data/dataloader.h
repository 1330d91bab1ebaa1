// DataLoader: splits a Dataset into batches (optionally shuffled with a seeded Generator,
// a fresh permutation each epoch) and is iterated with range-for, one epoch per loop.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "core/random.h"
#include "data/dataset.h"

namespace mg::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;  // drop the last batch when it is smaller than batch_size
  // Shuffling draws each epoch's permutation from Generator(seed), or from `generator` when
  // set (not owned). Epoch k's order depends only on the seed and k.
  uint64_t seed = 0;
  Generator* generator = nullptr;
  // Reserved for worker threads / pinned host memory (later): must stay 0 / false for now.
  int num_workers = 0;
  bool pin_memory = false;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions opts);

  // Batches per epoch.
  int64_t size() const;
  int64_t batch_size() const { return opts_.batch_size; }
  const Dataset& dataset() const { return *dataset_; }
  // Number of epochs started (begin() calls).
  int64_t epoch() const { return epoch_; }
  // Sample order of the current epoch (a permutation of 0..N-1 when shuffling).
  const std::vector<int64_t>& order() const { return order_; }
  // The dataset indices batch `b` of the current epoch is made of.
  std::vector<int64_t> batch_indices(int64_t b) const;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Example;
    using difference_type = std::ptrdiff_t;
    using pointer = Example*;
    using reference = Example&;

    Example& operator*() { return current_; }
    Example* operator->() { return &current_; }
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return batch_ == o.batch_; }
    bool operator!=(const Iterator& o) const { return batch_ != o.batch_; }
    // Index of the batch this iterator is at within the epoch.
    int64_t batch() const { return batch_; }

   private:
    friend class DataLoader;
    Iterator(DataLoader* loader, int64_t batch);
    DataLoader* loader_ = nullptr;
    int64_t batch_ = 0;
    Example current_;
  };

  // Starts a new epoch (reshuffles when shuffle is on) and returns its first batch. Only
  // one epoch's iteration can be in flight at a time.
  Iterator begin();
  Iterator end();

 private:
  // Loads batch `b` of the current epoch; batches are allocated as MemoryCategory::Data.
  // This is the seam where a worker pool / prefetch queue will plug in.
  Example fetch(int64_t b) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opts_;
  Generator own_gen_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace mg::data
