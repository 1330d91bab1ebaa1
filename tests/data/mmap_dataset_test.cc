// MmapDataset: records read back exactly (stored dtype, converted, through the DataLoader),
// bad files, resident memory on a 320 MiB sparse file, and Fashion-MNIST through a record file.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>

#include "data/dataloader.h"
#include "tests/error_of.h"
#include "data/fashion_mnist.h"
#include "data/idx.h"
#include "data/mmap_dataset.h"

namespace mg::data {
namespace {

std::string tmp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// Resident set size of this process in bytes (second field of /proc/self/statm).
int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

RecordLayout small_layout(DType data = DType::u8, DType target = DType::u8) {
  RecordLayout l;
  l.data_shape = {2, 3};
  l.data_dtype = data;
  l.target_dtype = target;
  return l;
}

// A synthetic Fashion-MNIST in IDX form under tmp/<name>: n images and labels per split.
std::string fake_fashion_mnist(const std::string& name, int64_t n) {
  const std::string root = tmp_path(name);
  ::mkdir(root.c_str(), 0755);
  std::vector<uint8_t> px(n * 784), lb(n);
  for (int64_t i = 0; i < n * 784; ++i) px[i] = static_cast<uint8_t>((i * 131) % 256);
  for (int64_t i = 0; i < n; ++i) lb[i] = static_cast<uint8_t>(i % 10);
  for (const char* split : {"train", "t10k"}) {
    write_idx(root + "/" + split + "-images-idx3-ubyte.gz", from_vector(px, {n, 28, 28}));
    write_idx(root + "/" + split + "-labels-idx1-ubyte.gz", from_vector(lb, {n}));
  }
  return root;
}

using mg::testing::error_of;

ino_t inode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

void flip_byte(const std::string& path, off_t at) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, at), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
  ::close(fd);
}

TEST(MmapDataset, RoundTripStoredAndConverted) {
  const std::string p = tmp_path("small.rec");
  const int64_t n = 9;
  std::vector<float> d;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n * 6; ++i) d.push_back(static_cast<float>((i * 37) % 251));
  for (int64_t i = 0; i < n; ++i) t.push_back((i * 7) % 10);
  Tensor data = from_vector(d, {n, 2, 3}), targets = from_vector(t, {n});
  write_records(p, small_layout(), data, targets);
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, RecordFileHeader::kBytes + n * 7);  // the header, then 6 data bytes + 1 target byte each

  MmapDataset raw_ds(p, small_layout());
  EXPECT_EQ(raw_ds.size(), n);
  Example e = raw_ds.get(4);
  EXPECT_EQ(e.data.dtype(), DType::u8);
  EXPECT_EQ(e.data.sizes(), (Shape{2, 3}));
  EXPECT_EQ(e.target.dtype(), DType::i64);
  EXPECT_EQ(e.target.item<int64_t>(), t[4]);
  EXPECT_EQ(raw::to_dtype(e.data, DType::f32).to_vector<float>(), std::vector<float>(d.begin() + 24, d.begin() + 30));

  MmapDatasetOptions o;
  o.out_dtype = DType::f32;
  o.scale = 0.5;
  o.shift = -1.0;
  MmapDataset conv(p, small_layout(), o);
  Example b = conv.get_batch({8, 0, 3});
  EXPECT_EQ(b.data.sizes(), (Shape{3, 2, 3}));
  auto bv = b.data.to_vector<float>();
  const int64_t rows[3] = {8, 0, 3};
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(bv[k * 6 + j], d[rows[k] * 6 + j] * 0.5f - 1.0f);
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{t[8], t[0], t[3]}));

  // Wider dtypes in the record (f32 data, i32 target), converted to f64.
  const std::string p2 = tmp_path("wide.rec");
  write_records(p2, small_layout(DType::f32, DType::i32), data, targets);
  o.out_dtype = DType::f64;
  MmapDataset wide(p2, small_layout(DType::f32, DType::i32), o);
  EXPECT_EQ(wide.get(2).data.to_vector<double>()[1], d[13] * 0.5 - 1.0);
  EXPECT_EQ(wide.get(2).target.item<int64_t>(), t[2]);
}

TEST(MmapDataset, ThroughTheDataLoaderWithWorkers) {
  const std::string p = tmp_path("loader.rec");
  const int64_t n = 100;
  std::vector<float> d(n * 6);
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 6; ++j) d[i * 6 + j] = static_cast<float>(i);
    t[i] = i % 256;
  }
  write_records(p, small_layout(), from_vector(d, {n, 2, 3}), from_vector(t, {n}));
  auto ds = std::make_shared<MmapDataset>(p, small_layout());
  DataLoaderOptions o;
  o.batch_size = 8;
  o.shuffle = true;
  o.num_workers = 3;
  DataLoader loader(ds, o);
  int64_t seen = 0;
  for (auto& b : loader) {
    auto x = raw::to_dtype(b.data, DType::i64).to_vector<int64_t>();
    auto y = b.target.to_vector<int64_t>();
    for (size_t k = 0; k < y.size(); ++k) EXPECT_EQ(x[k * 6], y[k]);  // rows travel with their targets
    seen += static_cast<int64_t>(y.size());
  }
  EXPECT_EQ(seen, n);
}

TEST(MmapDataset, BadFilesAndIndices) {
  EXPECT_THROW(MmapDataset(tmp_path("does_not_exist.rec"), small_layout()), IOError);
  const std::string p = tmp_path("truncated.rec");
  write_records(p, small_layout(), zeros({3, 2, 3}), zeros({3}, {DType::i64}));
  ASSERT_EQ(::truncate(p.c_str(), RecordFileHeader::kBytes + 7 * 3 - 4), 0);  // 4 bytes short
  try {
    MmapDataset ds(p, small_layout());
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("has 145 bytes, but its header declares 3 records of 7 bytes"),
              std::string::npos)
        << e.what();
  }
  // A file without the header (raw records, as before the header existed) is not taken for one.
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << std::string(7 * 30, 'x');
  }
  try {
    MmapDataset ds(p, small_layout());
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("not a memgrad record file"), std::string::npos) << e.what();
  }
  const std::string ok = tmp_path("three.rec");
  write_records(ok, small_layout(), zeros({3, 2, 3}), zeros({3}, {DType::i64}));
  MmapDataset ds(ok, small_layout());
  EXPECT_THROW(ds.get(3), IndexError);
  EXPECT_THROW(ds.get_batch({0, -1}), IndexError);
  MmapDatasetOptions bad;
  bad.out_dtype = DType::i32;
  EXPECT_THROW(MmapDataset(ok, small_layout(), bad), DTypeError);
  EXPECT_THROW(write_records(ok, small_layout(), zeros({3, 3, 2}), zeros({3})), ShapeError);
  // Zero records: a header alone, an empty dataset. A zero-byte file is no record file.
  const std::string empty_path = tmp_path("empty.rec");
  write_records(empty_path, small_layout(), zeros({0, 2, 3}), zeros({0}, {DType::i64}));
  EXPECT_EQ(MmapDataset(empty_path, small_layout()).size(), 0);
  verify_records(empty_path, small_layout());
  std::ofstream(empty_path, std::ios::trunc).close();
  EXPECT_THROW(MmapDataset(empty_path, small_layout()), IOError);
}

// 320 MiB of records (3x32x32 u8 + label); only a few are written, the rest is a hole.
TEST(MmapDataset, ResidentMemoryStaysSmallOnAFullPass) {
  RecordLayout l;
  l.data_shape = {3, 32, 32};
  const int64_t rb = l.record_bytes();  // 3073
  const int64_t n = (int64_t{320} << 20) / rb;
  const std::string p = tmp_path("big.rec");
  const int fd = ::open(p.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  constexpr int64_t h = RecordFileHeader::kBytes;
  ASSERT_EQ(::ftruncate(fd, h + n * rb), 0);
  // The header's checksum is not that of the records: opening reads only the header.
  const std::string head = RecordFileHeader{l, n, 0}.encode();
  ASSERT_EQ(::pwrite(fd, head.data(), head.size(), 0), h);
  const int64_t marked[3] = {0, n / 2, n - 1};
  for (int64_t i : marked) {
    std::string rec(static_cast<size_t>(rb), static_cast<char>(i % 200 + 1));
    rec.back() = 7;
    ASSERT_EQ(::pwrite(fd, rec.data(), rec.size(), h + i * rb), static_cast<ssize_t>(rec.size()));
  }
  ::close(fd);

  const int64_t rss0 = rss_bytes();
  MmapDatasetOptions o;
  o.resident_budget = 16 << 20;
  auto ds = std::make_shared<MmapDataset>(p, l, o);
  EXPECT_EQ(ds->size(), n);
  EXPECT_LT(rss_bytes() - rss0, 4 << 20) << "mapping alone made pages resident";

  DataLoaderOptions lo;
  lo.batch_size = 512;  // 1.5 MiB per batch
  lo.shuffle = true;
  DataLoader loader(ds, lo);
  int64_t peak = 0, peak_map = 0, rows = 0;
  for (auto& b : loader) {
    rows += b.data.size(0);
    peak = std::max(peak, rss_bytes() - rss0);
    peak_map = std::max(peak_map, ds->resident_bytes());
  }
  EXPECT_EQ(rows, n);
  // The mapping itself: about the budget, against a 320 MiB file read end to end.
  EXPECT_LT(peak_map, 24 << 20) << "mapping resident peak " << (peak_map >> 20) << " MiB";
  // The whole process (heap included) stays far below the file size too.
  EXPECT_LT(peak, 96 << 20) << "process resident grew by " << (peak >> 20) << " MiB";
  std::printf("320 MiB file, full shuffled pass: mapping resident peak %.1f MiB, process RSS growth %.1f MiB\n",
              peak_map / 1048576.0, peak / 1048576.0);

  Example e = ds->get_batch({marked[0], marked[1], marked[2], 1});
  auto x = e.data.to_vector<uint8_t>();
  EXPECT_EQ(x[0], 1);
  EXPECT_EQ(x[3072 + 100], static_cast<uint8_t>(marked[1] % 200 + 1));
  EXPECT_EQ(x[2 * 3072 + 5], static_cast<uint8_t>(marked[2] % 200 + 1));
  EXPECT_EQ(x[3 * 3072], 0);  // a hole reads as zeros
  EXPECT_EQ(e.target.to_vector<int64_t>(), (std::vector<int64_t>{7, 7, 7, 0}));

  // The control: without dropping pages the same reads stay resident.
  MmapDatasetOptions keep;
  keep.resident_budget = 0;
  MmapDataset kept(p, l, keep);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n / 4; ++i) idx.push_back(i);  // 80 MiB
  for (size_t s = 0; s < idx.size(); s += 4096)
    kept.get_batch(std::vector<int64_t>(idx.begin() + s, idx.begin() + std::min(idx.size(), s + 4096)));
  EXPECT_GT(kept.resident_bytes(), 60 << 20) << "the control read did not fault pages in; the test measures nothing";
  EXPECT_GT(kept.cached_bytes(), 60 << 20);
  kept.release_pages();
  EXPECT_EQ(kept.resident_bytes(), 0);
  std::remove(p.c_str());
}

TEST(MmapDataset, FashionMNISTThroughARecordFile) {
  // A synthetic copy in IDX form (the real one when installed is checked below).
  const int64_t n = 50;
  const std::string root = fake_fashion_mnist("fmnist_mmap", n);
  const std::string raw_path = convert_fashion_mnist(root, true, tmp_path("fmnist_train.rec"));
  for (bool normalize : {false, true}) {
    auto mm = fashion_mnist_mmap(raw_path, normalize);
    FashionMNISTOptions fo;
    fo.normalize = normalize;
    FashionMNIST ref(Split::Train, root, fo);
    ASSERT_EQ(mm->size(), n);
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = n - 1 - i;
    Example a = mm->get_batch(all), b = ref.get_batch(all);
    EXPECT_EQ(a.data.sizes(), (Shape{n, 1, 28, 28}));
    auto av = a.data.to_vector<float>(), bv = b.data.to_vector<float>();
    for (size_t i = 0; i < av.size(); ++i) ASSERT_NEAR(av[i], bv[i], 1e-6) << i;
    EXPECT_EQ(a.target.to_vector<int64_t>(), b.target.to_vector<int64_t>());
  }
  // Already converted: not rewritten.
  struct stat before {
  }, after{};
  ::stat(raw_path.c_str(), &before);
  convert_fashion_mnist(root, true, raw_path);
  ::stat(raw_path.c_str(), &after);
  EXPECT_EQ(before.st_ino, after.st_ino);  // a rewrite renames a new file into place

  const std::string real = FashionMNIST::default_root();
  if (!FashionMNIST::available(real)) GTEST_SKIP() << "the installed Fashion-MNIST part needs " << real;
  auto test_set = fashion_mnist_mmap(convert_fashion_mnist(real, false, tmp_path("fmnist_t10k.rec")));
  FashionMNIST ref(Split::Test, real);
  EXPECT_EQ(test_set->size(), 10000);
  Example a = test_set->get_batch({0, 4321, 9999}), b = ref.get_batch({0, 4321, 9999});
  EXPECT_EQ(a.data.to_vector<float>(), b.data.to_vector<float>());
  EXPECT_EQ(a.target.to_vector<int64_t>(), b.target.to_vector<int64_t>());
}

// The header names the layout, so a file read with another layout (or a damaged header) is an
// error naming both, not records read at the wrong stride.
TEST(MmapDataset, TheHeaderMustMatchTheLayout) {
  const std::string p = tmp_path("layout.rec");
  write_records(p, small_layout(), zeros({4, 2, 3}), zeros({4}, {DType::i64}));
  std::string msg = error_of<IOError>([&] { MmapDataset(p, small_layout(DType::u8, DType::i32)); });
  EXPECT_NE(msg.find("holds records of data [2, 3] u8 + target u8, not the data [2, 3] u8 + target i32"),
            std::string::npos)
      << msg;
  RecordLayout other = small_layout();
  other.data_shape = {3, 2};  // same record size, other shape: the old size check passed it
  msg = error_of<IOError>([&] { MmapDataset(p, other); });
  EXPECT_NE(msg.find("not the data [3, 2]"), std::string::npos) << msg;
  flip_byte(p, 40);  // a dim in the header
  msg = error_of<IOError>([&] { MmapDataset(p, small_layout()); });
  EXPECT_NE(msg.find("header is corrupt"), std::string::npos) << msg;
}

// convert_fashion_mnist reused any file whose size was a whole number of records, so a damaged
// conversion (or another file of that size) was read as Fashion-MNIST forever. Now the records'
// CRC-32 decides: damage is found and the file converted again.
TEST(MmapDataset, ConvertedFileIsCheckedByContent) {
  const int64_t n = 20;
  const std::string root = fake_fashion_mnist("fmnist_crc", n);
  const std::string out = tmp_path("fmnist_crc.rec");
  convert_fashion_mnist(root, true, out);
  const RecordLayout l = fashion_mnist_layout();
  verify_records(out, l);
  const std::vector<float> good = fashion_mnist_mmap(out)->get_batch({0, 7, 19}).data.to_vector<float>();

  flip_byte(out, RecordFileHeader::kBytes + 7 * 785 + 300);  // one pixel of record 7
  std::string msg = error_of<IOError>([&] { verify_records(out, l); });
  EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
  EXPECT_NE(msg.find(out), std::string::npos) << msg;
  MmapDatasetOptions o;
  o.verify_checksum = true;
  EXPECT_THROW(MmapDataset(out, l, o), IOError);
  const ino_t damaged = inode_of(out);
  convert_fashion_mnist(root, true, out);
  EXPECT_NE(inode_of(out), damaged) << "the damaged file was kept";
  verify_records(out, l);
  EXPECT_EQ(fashion_mnist_mmap(out)->get_batch({0, 7, 19}).data.to_vector<float>(), good);

  // A file of the right size that is not a record file at all.
  {
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    f << std::string(static_cast<size_t>(RecordFileHeader::kBytes + n * 785), '\0');
  }
  convert_fashion_mnist(root, true, out);
  verify_records(out, l);
  // An intact file is kept (same inode: not rewritten).
  const ino_t intact = inode_of(out);
  convert_fashion_mnist(root, true, out);
  EXPECT_EQ(inode_of(out), intact);
}

// write_records used the temporary name "<path>.tmp.<pid>" and fopen("wb"): anyone who could write
// the directory could plant a symlink there and have the next conversion overwrite the link's
// target. Now the temporary file comes from mkstemp (O_EXCL, a random name), and gets mode 0644
// whatever the umask (fchmod; the umask is not touched).
TEST(MmapDataset, WritesThroughAnUnpredictableTemporaryFile) {
  const std::string p = tmp_path("planted.rec"), victim = tmp_path("victim.txt");
  {
    std::ofstream f(victim);
    f << "keep me";
  }
  const std::string planted = p + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), planted.c_str()), 0);
  const mode_t old = ::umask(077);
  write_records(p, small_layout(), zeros({2, 2, 3}), zeros({2}, {DType::i64}));
  EXPECT_EQ(::umask(old), mode_t{077});
  std::ifstream f(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "keep me");
  struct stat st {};
  ASSERT_EQ(::lstat(p.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(MmapDataset(p, small_layout()).size(), 2);
  ::unlink(planted.c_str());
}

// Documents the one failure that cannot become an exception: the file shrinks under the mapping
// and a read touches a page past its new end; the kernel raises SIGBUS (ASan reports it as a
// BUS error and exits non-zero; either way the process dies).
TEST(MmapDatasetDeathTest, TruncatingAMappedFileRaisesSIGBUS) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RecordLayout l;
  l.data_shape = {4096};
  const std::string p = tmp_path("sigbus.rec");
  write_records(p, l, zeros({8, 4096}), zeros({8}, {DType::i64}));
  EXPECT_DEATH(
      {
        MmapDataset ds(p, l);
        if (::truncate(p.c_str(), RecordFileHeader::kBytes) != 0) std::abort();
        ds.get(7);
      },
      "");
}

}  // namespace
}  // namespace mg::data
