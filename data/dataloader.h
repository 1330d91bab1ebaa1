// DataLoader: splits a Dataset into batches (optionally shuffled with a seeded Generator,
// a fresh permutation each epoch) and is iterated with range-for, one epoch per loop.
// Batches can be loaded by worker threads (ordered, deterministic whatever the worker count),
// staged in pinned host memory, and copied to a CUDA device on a side stream so that the copy
// of batch k+1 overlaps the step on batch k.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <vector>

#include "core/device_runtime.h"
#include "core/random.h"
#include "data/dataset.h"
#include "data/transforms.h"

namespace mg::data {

// Turns the examples of one batch into the batch (default: collate_stack).
using CollateFn = std::function<Example(std::vector<Example>&)>;

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;  // drop the last batch when it is smaller than batch_size
  // Shuffling draws each epoch's permutation from Generator(seed), or from `generator` when
  // set (not owned). Epoch k's order depends only on the seed and k. Transforms draw from
  // SampleRng::for_sample(seed, epoch, sample index).
  uint64_t seed = 0;
  Generator* generator = nullptr;
  // Applied to each example's data before collation (per sample; see transforms.h).
  TransformPtr transform;
  // Custom collation. With neither transform nor collate, Dataset::get_batch is used (the
  // TensorDataset / MmapDataset gather fast path).
  CollateFn collate;
  // Worker threads loading batches ahead of the consumer (0: load on the calling thread).
  // At most num_workers * prefetch_factor batches are loaded ahead. Batches arrive in order
  // and are identical whatever num_workers is.
  int num_workers = 0;
  int prefetch_factor = 2;
  // Batches in page-locked host memory (from a reusable pool): host-to-device copies from
  // them are asynchronous. Needs a CUDA device.
  bool pin_memory = false;
  // A CUDA device here: each batch is copied there on the loader's side stream; the stream
  // current at delivery waits for the copy on the device (no host sync).
  Device device = Device::cpu();
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions opts);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch.
  int64_t size() const;
  int64_t batch_size() const { return opts_.batch_size; }
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return opts_; }
  // Number of epochs started (begin() calls).
  int64_t epoch() const { return epoch_; }
  // Makes the next begin() start epoch `epochs_done` (0-based) with exactly the order and
  // transforms an uninterrupted run would have there: how a resumed job picks up its data
  // stream (the loader's own generator is re-seeded and advanced past the earlier epochs).
  // With an external DataLoaderOptions::generator, restoring that generator is the caller's.
  void set_epoch(int64_t epochs_done);
  // Sample order of the current epoch (a permutation of 0..N-1 when shuffling).
  const std::vector<int64_t>& order() const { return order_; }
  // The dataset indices batch `b` of the current epoch is made of.
  std::vector<int64_t> batch_indices(int64_t b) const;
  // Stops the workers of the epoch in flight (they finish the batch they are on) and drops
  // the batches they loaded ahead. begin() and the destructor do this too.
  void shutdown();
  // Pinned host buffers the loader holds (in use or free for reuse).
  int64_t pinned_buffers() const;

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

  // Starts a new epoch (stops the previous one's workers, reshuffles when shuffle is on) and
  // returns its first batch. Only one epoch's iteration can be in flight at a time.
  Iterator begin();
  Iterator end();

 private:
  class Workers;
  class PinnedPool;

  // Batch `b` on the host: dataset -> transform -> collate -> (pinned). Runs on workers.
  // Errors are rethrown with the batch, epoch and (when known) worker in the message.
  Example load_host(int64_t b, int worker) const;
  // The next batch in order, from the workers or loaded here, moved to opts_.device.
  Example next(int64_t b);
  Example to_device(Example host);

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opts_;
  Generator own_gen_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
  std::unique_ptr<Workers> workers_;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<cuda::Stream> copy_stream_;
  // Host batches whose asynchronous copy may still be reading them, with the copy's event.
  std::vector<std::pair<cuda::Event, Example>> in_flight_;
};

}  // namespace mg::data
