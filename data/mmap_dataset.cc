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
#include <sstream>
#include <vector>

#include <zlib.h>

#include "core/atomic_file.h"
#include "data/fashion_mnist.h"

namespace mg::data {

int64_t RecordLayout::data_bytes() const {
  return shape_numel(data_shape) * static_cast<int64_t>(dtype_size(data_dtype));
}

int64_t RecordLayout::record_bytes() const {
  return data_bytes() + (has_target ? static_cast<int64_t>(dtype_size(target_dtype)) : 0);
}

namespace {

constexpr char kMagic[8] = {'M', 'G', 'R', 'E', 'C', 'O', 'R', 'D'};
constexpr int kMaxDims = 8;
constexpr size_t kHeaderCrcAt = 124;

template <class T>
void put_le(std::string& b, size_t at, T v) {
  std::memcpy(&b[at], &v, sizeof v);  // the host is little-endian (as safetensors assumes)
}
template <class T>
T get_le(const std::string& b, size_t at) {
  T v;
  std::memcpy(&v, &b[at], sizeof v);
  return v;
}

uint32_t crc32_of(uint32_t crc, const void* p, size_t n) {
  const auto* b = static_cast<const Bytef*>(p);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, b, chunk));
    b += chunk;
    n -= chunk;
  }
  return crc;
}

std::string layout_str(const RecordLayout& l) {
  std::ostringstream os;
  os << "data " << shape_str(l.data_shape) << " " << l.data_dtype;
  if (l.has_target) os << " + target " << l.target_dtype;
  return os.str();
}

bool same_layout(const RecordLayout& a, const RecordLayout& b) {
  return a.data_shape == b.data_shape && a.data_dtype == b.data_dtype && a.has_target == b.has_target &&
         (!a.has_target || a.target_dtype == b.target_dtype);
}

void check_layout(const RecordLayout& l, const char* op) {
  for (int64_t d : l.data_shape)
    MG_CHECK(d >= 1, ValueError, op, ": record data shape ", shape_str(l.data_shape), " has a non-positive dim");
  MG_CHECK(l.data_dtype != DType::b8, DTypeError, op, ": b8 records are not supported");
  MG_CHECK(!l.has_target || is_integral(l.target_dtype), DTypeError, op, ": target dtype must be integral, got ",
           l.target_dtype);
}

// Reads the header of an open file and checks it against `layout` and the file's size.
RecordFileHeader read_header(int fd, int64_t file_bytes, const RecordLayout& layout, const std::string& path,
                             const char* op) {
  MG_CHECK(file_bytes >= RecordFileHeader::kBytes, IOError, op, ": ", path, " has ", file_bytes,
           " bytes, less than a record file's ", RecordFileHeader::kBytes, "-byte header (not a record file?)");
  std::string bytes(RecordFileHeader::kBytes, '\0');
  MG_CHECK(::pread(fd, bytes.data(), bytes.size(), 0) == RecordFileHeader::kBytes, IOError, op, ": ", path,
           ": cannot read the header: ", std::strerror(errno));
  RecordFileHeader h = RecordFileHeader::decode(bytes, path);
  MG_CHECK(same_layout(h.layout, layout), IOError, op, ": ", path, " holds records of ", layout_str(h.layout),
           ", not the ", layout_str(layout), " asked for");
  const int64_t rb = layout.record_bytes();
  MG_CHECK(h.num_records <= (file_bytes - RecordFileHeader::kBytes) / rb &&
               RecordFileHeader::kBytes + h.num_records * rb == file_bytes,
           IOError, op, ": ", path, " has ", file_bytes, " bytes, but its header declares ", h.num_records,
           " records of ", rb, " bytes (", layout_str(layout), ") after the ", RecordFileHeader::kBytes,
           "-byte header; truncated or extended file?");
  return h;
}

}  // namespace

std::string RecordFileHeader::encode() const {
  MG_CHECK(layout.data_shape.size() <= kMaxDims, ValueError, "RecordFileHeader: data shape ",
           shape_str(layout.data_shape), " has more than ", kMaxDims, " dims");
  std::string b(kBytes, '\0');
  std::memcpy(b.data(), kMagic, sizeof kMagic);
  put_le<uint32_t>(b, 8, kVersion);
  put_le<uint32_t>(b, 12, static_cast<uint32_t>(kBytes));
  b[16] = static_cast<char>(layout.data_dtype);
  b[17] = layout.has_target ? 1 : 0;
  b[18] = static_cast<char>(layout.has_target ? layout.target_dtype : DType::u8);
  b[19] = static_cast<char>(layout.data_shape.size());
  put_le<uint32_t>(b, 20, payload_crc32);
  put_le<int64_t>(b, 24, num_records);
  for (size_t d = 0; d < layout.data_shape.size(); ++d) put_le<int64_t>(b, 32 + 8 * d, layout.data_shape[d]);
  put_le<int64_t>(b, 96, layout.record_bytes());
  put_le<uint32_t>(b, kHeaderCrcAt, crc32_of(0, b.data(), kHeaderCrcAt));
  return b;
}

RecordFileHeader RecordFileHeader::decode(const std::string& b, const std::string& path) {
  MG_CHECK(b.size() == static_cast<size_t>(kBytes) && std::memcmp(b.data(), kMagic, sizeof kMagic) == 0, IOError,
           "MmapDataset: ", path,
           " is not a memgrad record file (no MGRECORD header; files written before the "
           "header existed must be converted again)");
  const uint32_t version = get_le<uint32_t>(b, 8);
  MG_CHECK(version == kVersion, IOError, "MmapDataset: ", path, ": record file version ", version,
           ", this build reads version ", kVersion);
  const uint32_t want = get_le<uint32_t>(b, kHeaderCrcAt), got = crc32_of(0, b.data(), kHeaderCrcAt);
  MG_CHECK(want == got, IOError, "MmapDataset: ", path, ": the header is corrupt (CRC-32 ", got, ", stored ", want,
           ")");
  const auto code_ok = [](unsigned char c) { return c <= static_cast<unsigned char>(DType::b8); };
  const auto d0 = static_cast<unsigned char>(b[16]), t0 = static_cast<unsigned char>(b[18]);
  const int ndim = static_cast<unsigned char>(b[19]);
  MG_CHECK(get_le<uint32_t>(b, 12) == kBytes && code_ok(d0) && code_ok(t0) && static_cast<unsigned char>(b[17]) <= 1 &&
               ndim <= kMaxDims,
           IOError, "MmapDataset: ", path, ": the header holds out-of-range fields (corrupt file?)");
  RecordFileHeader h;
  h.layout.data_dtype = static_cast<DType>(d0);
  h.layout.has_target = b[17] == 1;
  h.layout.target_dtype = static_cast<DType>(t0);
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    const int64_t n = get_le<int64_t>(b, 32 + 8 * d);
    MG_CHECK(n >= 1 && !__builtin_mul_overflow(numel, n, &numel), IOError, "MmapDataset: ", path, ": the header's dim ",
             d, " is ", n, " (corrupt file?)");
    h.layout.data_shape.push_back(n);
  }
  h.num_records = get_le<int64_t>(b, 24);
  h.payload_crc32 = get_le<uint32_t>(b, 20);
  MG_CHECK(h.num_records >= 0 && numel <= (int64_t{1} << 48) && get_le<int64_t>(b, 96) == h.layout.record_bytes(),
           IOError, "MmapDataset: ", path, ": the header's record count ", h.num_records, " or record size ",
           get_le<int64_t>(b, 96), " is inconsistent (corrupt file?)");
  return h;
}

void verify_records(const std::string& path, const RecordLayout& layout) {
  check_layout(layout, "verify_records");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  MG_CHECK(fd.fd >= 0, IOError, "verify_records: cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  MG_CHECK(::fstat(fd.fd, &st) == 0, IOError, "verify_records: cannot stat ", path, ": ", std::strerror(errno));
  const RecordFileHeader h = read_header(fd.fd, st.st_size, layout, path, "verify_records");
  std::vector<unsigned char> buf(1 << 20);
  uint32_t crc = 0;
  for (int64_t off = RecordFileHeader::kBytes; off < st.st_size;) {
    const ssize_t got = ::pread(fd.fd, buf.data(), std::min<int64_t>(buf.size(), st.st_size - off), off);
    if (got < 0 && errno == EINTR) continue;
    MG_CHECK(got > 0, IOError, "verify_records: reading ", path, " at byte ", off,
             " failed: ", got == 0 ? "unexpected end of file" : std::strerror(errno));
    crc = crc32_of(crc, buf.data(), static_cast<size_t>(got));
    off += got;
  }
  MG_CHECK(crc == h.payload_crc32, IOError, "verify_records: ", path, ": the records' CRC-32 is ", crc,
           " but the header says ", h.payload_crc32, " (damaged file)");
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
  check_layout(layout_, "MmapDataset");
  if (opts_.out_dtype && *opts_.out_dtype != layout_.data_dtype)
    MG_CHECK(*opts_.out_dtype == DType::f32 || *opts_.out_dtype == DType::f64, DTypeError,
             "MmapDataset: out_dtype must be the stored dtype (", layout_.data_dtype, "), f32 or f64; got ",
             *opts_.out_dtype);
  MG_CHECK(opts_.resident_budget >= 0, ValueError, "MmapDataset: resident_budget must be >= 0, got ",
           opts_.resident_budget);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  MG_CHECK(fd.fd >= 0, IOError, "MmapDataset: cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  MG_CHECK(::fstat(fd.fd, &st) == 0, IOError, "MmapDataset: cannot stat ", path, ": ", std::strerror(errno));
  file_bytes_ = st.st_size;
  num_records_ = read_header(fd.fd, file_bytes_, layout_, path, "MmapDataset").num_records;
  if (opts_.verify_checksum) verify_records(path, layout_);
  void* p = ::mmap(nullptr, static_cast<size_t>(file_bytes_), PROT_READ, MAP_SHARED, fd.fd, 0);
  const int e = errno;  // the mapping keeps the file open after fd closes
  MG_CHECK(p != MAP_FAILED, IOError, "MmapDataset: mmap of ", path, " (", file_bytes_,
           " bytes) failed: ", std::strerror(e));
  map_->addr = static_cast<uint8_t*>(p);
  map_->len = static_cast<size_t>(file_bytes_);
  records_ = map_->addr + RecordFileHeader::kBytes;
  (void)::madvise(p, map_->len, opts_.random_access ? MADV_RANDOM : MADV_SEQUENTIAL);
  map_->pagemap_fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
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
      const uint8_t* src = records_ + indices[k] * rb;
      for (int64_t j = 0; j < per; ++j) dst[k * per + j] = lut[src[j]];
    }
  } else {
    Tensor raw_data = out == layout_.data_dtype ? ex.data : empty(shape, {layout_.data_dtype, Device::cpu()});
    auto* dst = static_cast<uint8_t*>(raw_data.raw_data());
    for (int64_t k = 0; k < b; ++k) std::memcpy(dst + k * db, records_ + indices[k] * rb, static_cast<size_t>(db));
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
    for (int64_t k = 0; k < b; ++k) std::memcpy(dst + k * ts, records_ + indices[k] * rb + db, ts);
    ex.target = raw::to_dtype(t, DType::i64);
  }
  // Pages, not bytes, count against the budget: shuffled records each touch their own.
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t pages = 0;
  constexpr int64_t h = RecordFileHeader::kBytes;
  for (int64_t i : indices) pages += (h + i * rb + rb - 1) / page - (h + i * rb) / page + 1;
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
  check_layout(layout, "write_records");
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
  const auto* dp = static_cast<const uint8_t*>(d.raw_data());
  const auto* tp = t.defined() ? static_cast<const uint8_t*>(t.raw_data()) : nullptr;
  const size_t db = static_cast<size_t>(layout.data_bytes()), ts = t.defined() ? t.element_size() : 0;
  RecordFileHeader h;
  h.layout = layout;
  h.num_records = n;
  for (int64_t i = 0; i < n; ++i) {
    h.payload_crc32 = crc32_of(h.payload_crc32, dp + i * db, db);
    if (tp) h.payload_crc32 = crc32_of(h.payload_crc32, tp + i * ts, ts);
  }
  const std::string head = h.encode();
  write_file_atomically(path, [&](const ByteSink& sink) {
    sink(head.data(), head.size());
    // Records interleave data and target: gather them a few MiB at a time.
    std::vector<uint8_t> chunk;
    for (int64_t i = 0; i < n; ++i) {
      chunk.insert(chunk.end(), dp + i * db, dp + (i + 1) * db);
      if (tp) chunk.insert(chunk.end(), tp + i * ts, tp + (i + 1) * ts);
      if (chunk.size() >= (size_t{4} << 20) || i == n - 1) {
        sink(chunk.data(), chunk.size());
        chunk.clear();
      }
    }
  });
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
  const RecordLayout layout = fashion_mnist_layout();
  struct stat st {};
  if (::stat(out_path.c_str(), &st) == 0) {
    try {
      verify_records(out_path, layout);
      return out_path;  // converted before, and intact
    } catch (const IOError&) {
      // Damaged, foreign or older: convert again (the rename replaces it whole).
    }
  }
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
