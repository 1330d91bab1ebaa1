#include "data/mmap_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>

#include "data/fashion_mnist.h"

namespace mg::data {

int64_t RecordLayout::data_bytes() const {
  return shape_numel(data_shape) * static_cast<int64_t>(dtype_size(data_dtype));
}

int64_t RecordLayout::record_bytes() const {
  return data_bytes() + (has_target ? static_cast<int64_t>(dtype_size(target_dtype)) : 0);
}

struct MmapDataset::Mapping {
  uint8_t* addr = nullptr;
  size_t len = 0;
  std::atomic<int64_t> touched_since_check{0};
  std::mutex check_mu;
  int pagemap_fd = -1;  // /proc/self/pagemap: which of our pages are mapped, exactly
  ~Mapping() {
    if (addr) ::munmap(addr, len);
    if (pagemap_fd >= 0) ::close(pagemap_fd);
  }
  // Bytes of the mapping present in this process's page tables; -1 when pagemap is unreadable.
  int64_t present_bytes() const {
    if (pagemap_fd < 0) return -1;
    const int64_t page = ::sysconf(_SC_PAGESIZE);
    const uint64_t first = reinterpret_cast<uintptr_t>(addr) / page;
    const int64_t n = (static_cast<int64_t>(len) + page - 1) / page;
    std::vector<uint64_t> buf(std::min<int64_t>(n, 65536));
    int64_t present = 0;
    for (int64_t done = 0; done < n;) {
      const int64_t k = std::min<int64_t>(n - done, static_cast<int64_t>(buf.size()));
      const ssize_t got = ::pread(pagemap_fd, buf.data(), k * 8, static_cast<off_t>((first + done) * 8));
      if (got != k * 8) return -1;
      for (int64_t i = 0; i < k; ++i) present += (buf[i] >> 63) & 1;  // bit 63: page present
      done += k;
    }
    return present * page;
  }
};

MmapDataset::MmapDataset(const std::string& path, RecordLayout layout, MmapDatasetOptions opts)
    : path_(path), layout_(std::move(layout)), opts_(opts), map_(std::make_shared<Mapping>()) {
  for (int64_t d : layout_.data_shape)
    MG_CHECK(d >= 1, ValueError, "MmapDataset: record data shape ", shape_str(layout_.data_shape),
             " has a non-positive dim");
  MG_CHECK(layout_.data_dtype != DType::b8, DTypeError, "MmapDataset: b8 records are not supported");
  MG_CHECK(!layout_.has_target || is_integral(layout_.target_dtype), DTypeError,
           "MmapDataset: target dtype must be integral, got ", layout_.target_dtype);
  if (opts_.out_dtype && *opts_.out_dtype != layout_.data_dtype)
    MG_CHECK(*opts_.out_dtype == DType::f32 || *opts_.out_dtype == DType::f64, DTypeError,
             "MmapDataset: out_dtype must be the stored dtype (", layout_.data_dtype, "), f32 or f64; got ",
             *opts_.out_dtype);
  MG_CHECK(opts_.resident_budget >= 0, ValueError, "MmapDataset: resident_budget must be >= 0, got ",
           opts_.resident_budget);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MG_CHECK(fd >= 0, IOError, "MmapDataset: cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    MG_THROW(IOError, "MmapDataset: cannot stat ", path, ": ", std::strerror(e));
  }
  file_bytes_ = st.st_size;
  const int64_t rb = layout_.record_bytes();
  if (file_bytes_ % rb != 0) {
    ::close(fd);
    MG_THROW(IOError, "MmapDataset: ", path, " has ", file_bytes_, " bytes, not a whole number of ", rb,
             "-byte records (data ", shape_str(layout_.data_shape), " ", layout_.data_dtype,
             layout_.has_target ? " + target" : "", "); truncated file or wrong layout?");
  }
  num_records_ = file_bytes_ / rb;
  if (file_bytes_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(file_bytes_), PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping keeps the file open
    MG_CHECK(p != MAP_FAILED, IOError, "MmapDataset: mmap of ", path, " (", file_bytes_,
             " bytes) failed: ", std::strerror(e));
    map_->addr = static_cast<uint8_t*>(p);
    map_->len = static_cast<size_t>(file_bytes_);
    (void)::madvise(p, map_->len, opts_.random_access ? MADV_RANDOM : MADV_SEQUENTIAL);
    map_->pagemap_fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  } else {
    ::close(fd);
  }
}

MmapDataset::~MmapDataset() = default;

void MmapDataset::release_pages() const {
  // On a read-only file mapping this only unmaps the pages from this process; a later read
  // faults them back in from the page cache (or the disk), with the same contents.
  if (map_->addr) (void)::madvise(map_->addr, map_->len, MADV_DONTNEED);
}

int64_t MmapDataset::resident_bytes() const {
  if (!map_->addr) return 0;
  std::ifstream f("/proc/self/smaps");
  MG_CHECK(f.good(), IOError, "MmapDataset::resident_bytes: cannot read /proc/self/smaps");
  char head[32];
  std::snprintf(head, sizeof head, "%lx-", reinterpret_cast<unsigned long>(map_->addr));
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    if (line.rfind(head, 0) == 0)
      in = true;
    else if (in && line.rfind("Rss:", 0) == 0)
      return std::stoll(line.substr(4)) * 1024;  // "Rss:   123 kB"
  }
  MG_THROW(IOError, "MmapDataset::resident_bytes: mapping of ", path_, " not found in /proc/self/smaps");
}

int64_t MmapDataset::cached_bytes() const {
  if (!map_->addr) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((map_->len + page - 1) / page);
  MG_CHECK(::mincore(map_->addr, map_->len, vec.data()) == 0, IOError, "MmapDataset: mincore on ", path_,
           " failed: ", std::strerror(errno));
  int64_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n * static_cast<int64_t>(page);
}

void MmapDataset::account_read(int64_t bytes) const {
  const int64_t budget = opts_.resident_budget;
  if (budget == 0) return;  // 0: never drop pages
  // A read fault can map up to 64 KiB of neighbouring cached pages (fault-around), so what is
  // resident can run 16x ahead of the pages read. Every budget/16 of pages read, look at what
  // is really mapped (pagemap) and drop it all past budget/2: at most about 1.5x the budget.
  // Without pagemap, charge each page read as 64 KiB and drop at the budget.
  const int64_t total = map_->touched_since_check.fetch_add(bytes) + bytes;
  const bool exact = map_->pagemap_fd >= 0;
  if (total < (exact ? budget / 16 : budget)) return;
  std::unique_lock<std::mutex> lk(map_->check_mu, std::try_to_lock);
  if (!lk.owns_lock()) return;  // another thread is checking
  map_->touched_since_check.store(0);
  if (!exact || map_->present_bytes() >= budget / 2) release_pages();
}

Example MmapDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices)
    MG_CHECK(i >= 0 && i < num_records_, IndexError, "MmapDataset::get_batch: index ", i, " out of range [0, ",
             num_records_, ") in ", path_);
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t rb = layout_.record_bytes(), db = layout_.data_bytes();
  const DType out = opts_.out_dtype.value_or(layout_.data_dtype);
  Shape shape{b};
  shape.insert(shape.end(), layout_.data_shape.begin(), layout_.data_shape.end());
  const int64_t per = shape_numel(layout_.data_shape);
  Example ex;
  ex.data = empty(shape, {out, Device::cpu()});
  if (out == DType::f32 && layout_.data_dtype == DType::u8) {
    // The common image case in one pass: a 256-entry table replaces the multiply-add.
    float lut[256];
    for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(v * opts_.scale + opts_.shift);
    float* dst = ex.data.data_ptr<float>();
    for (int64_t k = 0; k < b; ++k) {
      const uint8_t* src = map_->addr + indices[k] * rb;
      for (int64_t j = 0; j < per; ++j) dst[k * per + j] = lut[src[j]];
    }
  } else {
    Tensor raw_data = out == layout_.data_dtype ? ex.data : empty(shape, {layout_.data_dtype, Device::cpu()});
    auto* dst = static_cast<uint8_t*>(raw_data.raw_data());
    for (int64_t k = 0; k < b; ++k) std::memcpy(dst + k * db, map_->addr + indices[k] * rb, static_cast<size_t>(db));
    if (!raw_data.is_same(ex.data)) {
      raw::copy_(ex.data, raw_data);
      if (opts_.scale != 1.0 || opts_.shift != 0.0) {
        if (out == DType::f32) {
          float* p = ex.data.data_ptr<float>();
          for (int64_t i = 0; i < b * per; ++i) p[i] = static_cast<float>(p[i] * opts_.scale + opts_.shift);
        } else {
          double* p = ex.data.data_ptr<double>();
          for (int64_t i = 0; i < b * per; ++i) p[i] = p[i] * opts_.scale + opts_.shift;
        }
      }
    }
  }
  if (layout_.has_target) {
    const size_t ts = dtype_size(layout_.target_dtype);
    Tensor t = empty({b}, {layout_.target_dtype, Device::cpu()});
    auto* dst = static_cast<uint8_t*>(t.raw_data());
    for (int64_t k = 0; k < b; ++k) std::memcpy(dst + k * ts, map_->addr + indices[k] * rb + db, ts);
    ex.target = raw::to_dtype(t, DType::i64);
  }
  // Pages, not bytes, count against the budget: shuffled records each touch their own.
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t pages = 0;
  for (int64_t i : indices) pages += (i * rb + rb - 1) / page - (i * rb) / page + 1;
  account_read(pages * (map_->pagemap_fd >= 0 ? page : int64_t{64} << 10));
  return ex;
}

Example MmapDataset::get(int64_t index) const {
  MG_CHECK(index >= 0 && index < num_records_, IndexError, "MmapDataset::get: index ", index, " out of range [0, ",
           num_records_, ") in ", path_);
  Example ex = get_batch({index});
  ex.data = raw::select(ex.data, 0, 0);
  if (ex.target.defined()) ex.target = raw::select(ex.target, 0, 0);
  return ex;
}

void write_records(const std::string& path, const RecordLayout& layout, const Tensor& data, const Tensor& targets) {
  MG_CHECK(data.defined() && data.device().is_cpu(), ValueError, "write_records: data must be a CPU tensor");
  Shape want{data.dim() >= 1 ? data.size(0) : 0};
  want.insert(want.end(), layout.data_shape.begin(), layout.data_shape.end());
  MG_CHECK(data.sizes() == want, ShapeError, "write_records: data has shape ", shape_str(data.sizes()),
           ", the layout needs ", shape_str(want));
  const int64_t n = data.size(0);
  MG_CHECK(layout.has_target == targets.defined(), ValueError, "write_records: the layout ",
           layout.has_target ? "has" : "has no", " target but targets are ", targets.defined() ? "given" : "missing");
  if (targets.defined())
    MG_CHECK(targets.dim() == 1 && targets.size(0) == n && targets.device().is_cpu(), ShapeError,
             "write_records: targets must be a CPU tensor [", n, "], got ", shape_str(targets.sizes()));
  Tensor d = raw::contiguous(raw::to_dtype(data, layout.data_dtype));
  Tensor t = targets.defined() ? raw::contiguous(raw::to_dtype(targets, layout.target_dtype)) : Tensor();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  MG_CHECK(f != nullptr, IOError, "write_records: cannot create ", tmp, ": ", std::strerror(errno));
  const auto* dp = static_cast<const uint8_t*>(d.raw_data());
  const auto* tp = t.defined() ? static_cast<const uint8_t*>(t.raw_data()) : nullptr;
  const size_t db = static_cast<size_t>(layout.data_bytes()), ts = t.defined() ? t.element_size() : 0;
  bool ok = true;
  for (int64_t i = 0; i < n && ok; ++i) {
    ok = std::fwrite(dp + i * db, 1, db, f) == db;
    if (ok && tp) ok = std::fwrite(tp + i * ts, 1, ts, f) == ts;
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    MG_THROW(IOError, "write_records: writing ", path, " failed: ", std::strerror(e));
  }
}

RecordLayout fashion_mnist_layout() {
  RecordLayout l;
  l.data_shape = {1, FashionMNIST::kImageSize, FashionMNIST::kImageSize};
  l.data_dtype = DType::u8;
  l.has_target = true;
  l.target_dtype = DType::u8;
  return l;
}

std::string convert_fashion_mnist(const std::string& root, bool train, const std::string& out_path) {
  struct stat st {};
  const RecordLayout layout = fashion_mnist_layout();
  if (::stat(out_path.c_str(), &st) == 0 && st.st_size > 0 && st.st_size % layout.record_bytes() == 0)
    return out_path;  // converted before
  FashionMNIST ds(train ? Split::Train : Split::Test, root);
  // Back to the stored bytes: FashionMNIST holds v / 255 in f32, which rounds back to v exactly.
  Tensor pixels = empty(ds.images().sizes(), {DType::u8, Device::cpu()});
  const float* src = ds.images().data_ptr<float>();
  uint8_t* dst = pixels.data_ptr<uint8_t>();
  for (int64_t i = 0; i < pixels.numel(); ++i) dst[i] = static_cast<uint8_t>(std::lrint(src[i] * 255.0f));
  write_records(out_path, layout, pixels, ds.labels());
  return out_path;
}

std::shared_ptr<MmapDataset> fashion_mnist_mmap(const std::string& raw_path, bool normalize) {
  MmapDatasetOptions o;
  o.out_dtype = DType::f32;
  FashionMNISTOptions fo;  // the same statistics FashionMNIST normalizes with
  o.scale = normalize ? 1.0 / (255.0 * fo.std) : 1.0 / 255.0;
  o.shift = normalize ? -fo.mean / fo.std : 0.0;
  return std::make_shared<MmapDataset>(raw_path, fashion_mnist_layout(), o);
}

}  // namespace mg::data
