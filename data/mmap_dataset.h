// A dataset over a raw file of fixed-size records, read through mmap (numpy's np.memmap):
// only the pages a batch touches are read, and the loader drops them again, so resident
// memory stays near zero however large the file. Fashion-MNIST can be converted to one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/dataset.h"

namespace mg::data {

// What one record holds: `data_shape` elements of `data_dtype`, then (when has_target) one
// `target_dtype` element. No header, no padding: record i starts at i * record_bytes().
struct RecordLayout {
  Shape data_shape;
  DType data_dtype = DType::u8;
  bool has_target = true;
  DType target_dtype = DType::u8;
  int64_t data_bytes() const;
  int64_t record_bytes() const;
};

struct MmapDatasetOptions {
  // Data comes out as `out_dtype` (unset: the stored dtype); a floating out_dtype gets
  // stored * scale + shift. Targets come out i64.
  std::optional<DType> out_dtype;
  double scale = 1.0;
  double shift = 0.0;
  // When the mapping's pages resident in this process pass about this much (checked through
  // /proc/self/pagemap as reads go), they are dropped (madvise MADV_DONTNEED; the page cache
  // keeps them). Resident memory stays within about 1.5x this. 0: never drop.
  int64_t resident_budget = 32 << 20;
  // MADV_RANDOM (shuffled access: no read-ahead of pages nobody asked for) or MADV_SEQUENTIAL.
  bool random_access = true;
};

class MmapDataset : public Dataset {
 public:
  // Maps `path` read-only. A missing file, or a size that is not a whole number of records,
  // raises mg::IOError naming the file and the sizes.
  MmapDataset(const std::string& path, RecordLayout layout, MmapDatasetOptions opts = {});
  ~MmapDataset() override;

  int64_t size() const override { return num_records_; }
  Example get(int64_t index) const override;
  // Gathers the records into one contiguous batch, converting on the way (no per-sample tensors).
  Example get_batch(const std::vector<int64_t>& indices) const override;

  const RecordLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }
  // Drops the mapping's pages from this process now (they stay in the page cache).
  void release_pages() const;
  // Bytes of the mapping resident in this process (its Rss line in /proc/self/smaps).
  int64_t resident_bytes() const;
  // Pages of the mapping in the page cache (mincore): what a re-read would not fetch from disk.
  int64_t cached_bytes() const;

 private:
  struct Mapping;
  void account_read(int64_t bytes) const;

  std::string path_;
  RecordLayout layout_;
  MmapDatasetOptions opts_;
  int64_t file_bytes_ = 0, num_records_ = 0;
  std::shared_ptr<Mapping> map_;
};

// Writes `data` ([N, ...]) and `targets` ([N], optional) as a record file with `layout`
// (data dtype converted to layout.data_dtype, targets to layout.target_dtype). Written to a
// temporary file and renamed, so a reader never sees a half-written file.
void write_records(const std::string& path, const RecordLayout& layout, const Tensor& data, const Tensor& targets);

// Fashion-MNIST as records of 784 u8 pixels + 1 u8 label (785 bytes).
RecordLayout fashion_mnist_layout();
// Converts the IDX files of the train (or test) split under `root` into `out_path` (written
// atomically), unless out_path already holds a whole number of records. Returns out_path.
std::string convert_fashion_mnist(const std::string& root, bool train, const std::string& out_path);
// The converted file as a dataset: images f32 [1, 28, 28] in [0, 1] (or normalized with the
// training statistics 0.2860 / 0.3530), labels i64.
std::shared_ptr<MmapDataset> fashion_mnist_mmap(const std::string& raw_path, bool normalize = false);

}  // namespace mg::data
