// Datasets and the DataLoader: batch counts, shuffling (seeded, per epoch, a permutation),
// the TensorDataset fast path against the generic stacking path.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data/dataloader.h"

namespace mg::data {
namespace {

// 10 examples: data [i, i + 0.5] (f32 [2]), target i (i64 scalar).
std::shared_ptr<TensorDataset> make_ds(int64_t n = 10) {
  std::vector<float> d;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) {
    d.push_back(static_cast<float>(i));
    d.push_back(static_cast<float>(i) + 0.5f);
    t.push_back(i);
  }
  return std::make_shared<TensorDataset>(from_vector(d, {n, 2}), from_vector(t, {n}));
}

// Same data, but without the batch fast path: exercises get() + collate_stack.
class SlowDataset : public Dataset {
 public:
  explicit SlowDataset(std::shared_ptr<TensorDataset> ds) : ds_(std::move(ds)) {}
  int64_t size() const override { return ds_->size(); }
  Example get(int64_t i) const override { return ds_->get(i); }

 private:
  std::shared_ptr<TensorDataset> ds_;
};

std::vector<int64_t> targets_of_epoch(DataLoader& loader) {
  std::vector<int64_t> out;
  for (auto& batch : loader) {
    auto t = batch.target.to_vector<int64_t>();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST(TensorDataset, GetAndBatch) {
  auto ds = make_ds();
  EXPECT_EQ(ds->size(), 10);
  Example e = ds->get(3);
  EXPECT_EQ(e.data.to_vector<float>(), (std::vector<float>{3.0f, 3.5f}));
  EXPECT_EQ(e.target.item<int64_t>(), 3);
  Example b = ds->get_batch({4, 1, 7});
  EXPECT_EQ(b.data.sizes(), (Shape{3, 2}));
  EXPECT_EQ(b.data.to_vector<float>(), (std::vector<float>{4, 4.5, 1, 1.5, 7, 7.5}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{4, 1, 7}));
  EXPECT_THROW(ds->get(10), IndexError);
  EXPECT_THROW(ds->get_batch({0, -1}), IndexError);
  EXPECT_THROW(TensorDataset(zeros({3, 2}), zeros({4})), ShapeError);
}

TEST(TensorDataset, FastPathMatchesStacking) {
  auto ds = make_ds();
  SlowDataset slow(ds);
  Example a = ds->get_batch({9, 0, 5});
  Example b = slow.get_batch({9, 0, 5});
  EXPECT_EQ(a.data.sizes(), b.data.sizes());
  EXPECT_EQ(a.target.sizes(), b.target.sizes());
  EXPECT_EQ(a.data.to_vector<float>(), b.data.to_vector<float>());
  EXPECT_EQ(a.target.to_vector<int64_t>(), b.target.to_vector<int64_t>());
}

TEST(DataLoader, BatchCounts) {
  auto ds = make_ds(10);
  DataLoaderOptions o;
  o.batch_size = 3;
  DataLoader keep(ds, o);
  EXPECT_EQ(keep.size(), 4);
  std::vector<int64_t> sizes;
  for (auto& b : keep) sizes.push_back(b.data.size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3, 1}));

  o.drop_last = true;
  DataLoader drop(ds, o);
  EXPECT_EQ(drop.size(), 3);
  sizes.clear();
  for (auto& b : drop) sizes.push_back(b.data.size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3}));

  o.batch_size = 5;  // divides evenly: drop_last changes nothing
  EXPECT_EQ(DataLoader(ds, o).size(), 2);
  o.batch_size = 20;
  EXPECT_EQ(DataLoader(ds, o).size(), 0);
  o.drop_last = false;
  EXPECT_EQ(DataLoader(ds, o).size(), 1);
}

TEST(DataLoader, SequentialOrderWithoutShuffle) {
  DataLoaderOptions o;
  o.batch_size = 4;
  DataLoader loader(make_ds(), o);
  std::vector<int64_t> want(10);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(targets_of_epoch(loader), want);
  EXPECT_EQ(targets_of_epoch(loader), want);
  EXPECT_EQ(loader.epoch(), 2);
}

// A resumed job calls set_epoch(k) on a fresh loader: epoch k must come out exactly as the
// uninterrupted loader's k-th epoch (and set_epoch(0) restarts the stream).
TEST(DataLoader, SetEpochResumesTheShuffleStream) {
  auto ds = make_ds(100);
  const DataLoaderOptions o{.batch_size = 7, .shuffle = true, .seed = 5};
  DataLoader full(ds, o);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 4; ++e) epochs.push_back(targets_of_epoch(full));
  DataLoader resumed(ds, o);
  resumed.set_epoch(2);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_EQ(targets_of_epoch(resumed), epochs[2]);
  EXPECT_EQ(targets_of_epoch(resumed), epochs[3]);
  resumed.set_epoch(0);
  EXPECT_EQ(targets_of_epoch(resumed), epochs[0]);
  EXPECT_THROW(resumed.set_epoch(-1), ValueError);
}

TEST(DataLoader, ShuffleIsAPermutationReproducibleAndChangesPerEpoch) {
  auto ds = make_ds(100);
  DataLoaderOptions o{.batch_size = 7, .shuffle = true, .seed = 42};
  DataLoader a(ds, o), b(ds, o);
  auto a1 = targets_of_epoch(a), a2 = targets_of_epoch(a);
  auto b1 = targets_of_epoch(b), b2 = targets_of_epoch(b);
  EXPECT_EQ(a1, b1);  // same seed, same epochs
  EXPECT_EQ(a2, b2);
  EXPECT_NE(a1, a2);  // a fresh order each epoch
  for (auto* e : {&a1, &a2}) {
    ASSERT_EQ(e->size(), 100u);
    std::set<int64_t> seen(e->begin(), e->end());
    EXPECT_EQ(seen.size(), 100u);  // every index exactly once
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 99);
  }
  std::vector<int64_t> sorted(100);
  std::iota(sorted.begin(), sorted.end(), 0);
  EXPECT_NE(a1, sorted);

  o.seed = 43;
  DataLoader c(ds, o);
  EXPECT_NE(targets_of_epoch(c), a1);

  // Data rows travel with their targets.
  DataLoader d(ds, o);
  for (auto& batch : d) {
    auto x = batch.data.to_vector<float>();
    auto t = batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(x[2 * i], static_cast<float>(t[i]));
  }
}

TEST(DataLoader, ShuffleWithDropLastSeesEachKeptIndexOnce) {
  DataLoaderOptions o;
  o.batch_size = 3;
  o.shuffle = true;
  o.drop_last = true;
  DataLoader loader(make_ds(10), o);
  auto t = targets_of_epoch(loader);
  EXPECT_EQ(t.size(), 9u);
  EXPECT_EQ(std::set<int64_t>(t.begin(), t.end()).size(), 9u);
}

TEST(DataLoader, ExternalGeneratorAndGenericDataset) {
  auto ds = std::make_shared<SlowDataset>(make_ds(10));
  Generator g1(5), g2(5);
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.generator = &g1;
  DataLoader a(ds, o);
  o.generator = &g2;
  DataLoader b(ds, o);
  auto ta = targets_of_epoch(a);
  EXPECT_EQ(ta, targets_of_epoch(b));
  EXPECT_EQ(std::set<int64_t>(ta.begin(), ta.end()).size(), 10u);
  for (auto& batch : a) EXPECT_EQ(batch.data.dim(), 2);
}

TEST(DataLoader, BadOptions) {
  auto ds = make_ds();
  DataLoaderOptions o;
  o.batch_size = 0;
  EXPECT_THROW(DataLoader(ds, o), ValueError);
  o.batch_size = 1;
  o.num_workers = -2;
  EXPECT_THROW(DataLoader(ds, o), ValueError);
  EXPECT_THROW(DataLoader(nullptr, DataLoaderOptions{}), ValueError);
}

TEST(DataLoader, BatchesAreCountedAsData) {
  auto ds = make_ds(10);
  DataLoaderOptions o;
  o.batch_size = 10;
  DataLoader loader(ds, o);
  auto& stats = CategoryStats::get(Device::cpu());
  const int64_t before = stats.counter(MemoryCategory::Data).current;
  auto it = loader.begin();
  EXPECT_EQ(stats.counter(MemoryCategory::Data).current - before, 10 * 2 * 4 + 10 * 8);
}

}  // namespace
}  // namespace mg::data
