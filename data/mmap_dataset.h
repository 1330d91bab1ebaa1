// A dataset over a file of fixed-size records, read through mmap (numpy's np.memmap): only the
// pages a batch touches are read, and the loader drops them again, so resident memory stays near
// zero however large the file. Fashion-MNIST can be converted to one.
//
// The file: a 128-byte header (magic, version, layout, record count, CRC-32 of the records, CRC-32
// of the header; RecordFileHeader), then the records back to back (np.memmap with offset=128).
//
// SIGBUS: the records are read straight from the mapping, so if another process truncates the
// file while it is mapped, touching a page past the new end raises SIGBUS and kills the process
// (the kernel has no bytes to give; this cannot be turned into an exception). Replace record
// files only by renaming a new file over them (write_records does), never truncate one in place.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/dataset.h"

namespace mg::data {

// What one record holds: `data_shape` elements of `data_dtype`, then (when has_target) one
// `target_dtype` element. No padding: record i starts at RecordFileHeader::kBytes + i * record_bytes().
struct RecordLayout {
  Shape data_shape;
  DType data_dtype = DType::u8;
  bool has_target = true;
  DType target_dtype = DType::u8;
  int64_t data_bytes() const;
  int64_t record_bytes() const;
};

// The record file's header, little-endian: "MGRECORD", u32 version (1), u32 header size (128),
// u8 data dtype, u8 has_target, u8 target dtype, u8 ndim (dtype codes: DType's values, f64 = 0 ...
// b8 = 7), u32 CRC-32 (zlib) of the records, i64 record count, i64 dims[8], i64 record bytes,
// zeros, and at byte 124 the CRC-32 of bytes 0..123.
struct RecordFileHeader {
  static constexpr int64_t kBytes = 128;
  static constexpr uint32_t kVersion = 1;
  RecordLayout layout;
  int64_t num_records = 0;
  uint32_t payload_crc32 = 0;
  std::string encode() const;
  // Parses and checks magic, version, header checksum and field ranges; mg::IOError naming
  // `path` and what is wrong otherwise.
  static RecordFileHeader decode(const std::string& bytes, const std::string& path);
};

// Checks `path` is a whole record file with `layout`: header, size, and (reading every byte
// once, not through a mapping) the records' CRC-32. mg::IOError naming the file and what differs.
void verify_records(const std::string& path, const RecordLayout& layout);

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
  // Also check the records' CRC-32 when opening (verify_records: reads the whole file once).
  // Off by default: opening then reads nothing but the header.
  bool verify_checksum = false;
};

class MmapDataset : public Dataset {
 public:
  // Maps `path` read-only. A missing file, a header that is not a record file's or describes
  // another layout, or a size that differs from what the header's record count implies raises
  // mg::IOError naming the file and the sizes. See the file comment about SIGBUS.
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
  const uint8_t* records_ = nullptr;  // the first record, RecordFileHeader::kBytes into the mapping
};

// Writes `data` ([N, ...]) and `targets` ([N], optional) as a record file with `layout`
// (data dtype converted to layout.data_dtype, targets to layout.target_dtype), header first.
// Written through write_file_atomically (core/atomic_file.h: mkstemp, mode 0644, fsync, rename,
// directory fsync), so a reader never sees a half-written file.
void write_records(const std::string& path, const RecordLayout& layout, const Tensor& data, const Tensor& targets);

// Fashion-MNIST as records of 784 u8 pixels + 1 u8 label (785 bytes).
RecordLayout fashion_mnist_layout();
// Converts the IDX files of the train (or test) split under `root` into `out_path` (written
// atomically), unless out_path already passes verify_records (header, size and checksum: a
// damaged or foreign file of the right size is converted again). Returns out_path.
std::string convert_fashion_mnist(const std::string& root, bool train, const std::string& out_path);
// The converted file as a dataset: images f32 [1, 28, 28] in [0, 1] (or normalized with the
// training statistics 0.2860 / 0.3530), labels i64.
std::shared_ptr<MmapDataset> fashion_mnist_mmap(const std::string& raw_path, bool normalize = false);

}  // namespace mg::data
