// The IDX reader on small files written here with zlib: values, types, and every way a
// file can be wrong (truncated header or data, bad magic, missing file).
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/idx.h"
#include "tests/error_of.h"
#include "tests/fuzz.h"

namespace mg::data {
namespace {

std::string tmp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// Writes raw bytes, gzipped when the name ends in .gz.
void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  const bool gz = path.size() > 3 && path.substr(path.size() - 3) == ".gz";
  gzFile f = gzopen(path.c_str(), gz ? "wb" : "wbT");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<unsigned char> header(unsigned char type, const std::vector<uint32_t>& dims) {
  std::vector<unsigned char> h = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) h.push_back(static_cast<unsigned char>(d >> s));
  return h;
}

std::string message_of(const std::string& path) {
  return mg::testing::error_of<IOError>([&] { read_idx(path); });
}

TEST(Idx, ReadsUnsignedBytesGz) {
  auto bytes = header(0x08, {2, 3, 2});
  for (int i = 0; i < 12; ++i) bytes.push_back(static_cast<unsigned char>(i * 20));
  const std::string path = tmp_path("u8.idx3.gz");
  write_bytes(path, bytes);
  Tensor t = read_idx(path);
  EXPECT_EQ(t.dtype(), DType::u8);
  EXPECT_EQ(t.sizes(), (Shape{2, 3, 2}));
  auto v = t.to_vector<int64_t>();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(v[i], i * 20);
}

TEST(Idx, ReadsPlainFilesAndOtherTypes) {
  // Big-endian int32 and float32.
  auto b = header(0x0C, {3});
  for (uint32_t x : {1u, 0xFFFFFFFFu, 0x01020304u})
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(x >> s));
  write_bytes(tmp_path("i32.idx"), b);
  Tensor t = read_idx(tmp_path("i32.idx"));
  EXPECT_EQ(t.dtype(), DType::i32);
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{1, -1, 0x01020304}));

  Tensor f = from_vector<float>({1.5f, -2.25f, 1e10f}, {3, 1});
  write_idx(tmp_path("f32.idx.gz"), f);
  Tensor g = read_idx(tmp_path("f32.idx.gz"));
  EXPECT_EQ(g.dtype(), DType::f32);
  EXPECT_EQ(g.sizes(), (Shape{3, 1}));
  EXPECT_EQ(g.to_vector<float>(), f.to_vector<float>());

  Tensor d = from_vector<double>({3.141592653589793, -1e-300}, {2});
  write_idx(tmp_path("f64.idx"), d);
  EXPECT_EQ(read_idx(tmp_path("f64.idx")).to_vector<double>(), d.to_vector<double>());

  auto sb = header(0x09, {2});
  sb.push_back(0xFF);
  sb.push_back(0x05);
  write_bytes(tmp_path("i8.idx"), sb);
  EXPECT_EQ(read_idx(tmp_path("i8.idx")).to_vector<int64_t>(), (std::vector<int64_t>{-1, 5}));
}

TEST(Idx, TruncatedDataIsIOError) {
  auto bytes = header(0x08, {10, 28, 28});
  bytes.resize(bytes.size() + 1000);  // 7840 expected
  for (const char* name : {"trunc.idx3.gz", "trunc.idx3"}) {
    const std::string path = tmp_path(name);
    write_bytes(path, bytes);
    std::string msg = message_of(path);
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected 7840 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got 1000"), std::string::npos) << msg;
  }
}

TEST(Idx, TruncatedHeaderIsIOError) {
  auto bytes = header(0x08, {10, 28, 28});
  bytes.resize(6);  // magic + half a dim
  write_bytes(tmp_path("trunc_header.gz"), bytes);
  std::string msg = message_of(tmp_path("trunc_header.gz"));
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dimension sizes"), std::string::npos) << msg;
  write_bytes(tmp_path("empty.gz"), {});
  msg = message_of(tmp_path("empty.gz"));
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
}

TEST(Idx, CompressedStreamCutShortIsIOError) {
  auto bytes = header(0x08, {100, 100});
  for (int i = 0; i < 10000; ++i) bytes.push_back(static_cast<unsigned char>(i * 7919 % 251));
  const std::string full = tmp_path("full.gz");
  write_bytes(full, bytes);
  // Keep only the first part of the .gz file itself.
  FILE* in = std::fopen(full.c_str(), "rb");
  ASSERT_NE(in, nullptr);
  std::vector<unsigned char> gz(1 << 16);
  gz.resize(std::fread(gz.data(), 1, gz.size(), in));
  std::fclose(in);
  const std::string cut = tmp_path("cut.gz");
  FILE* out = std::fopen(cut.c_str(), "wb");
  std::fwrite(gz.data(), 1, gz.size() / 2, out);
  std::fclose(out);
  std::string msg = message_of(cut);
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
}

// A header whose dims declare far more data than the file holds: the first version allocated the
// declared size before reading (a 22-byte file took the process to 2.1 GiB and 8-10 s before
// "truncated file"). Now a plain file is checked against its size, a gzip file against what it can
// inflate to (1032x), and gzip data goes into a buffer that grows as bytes arrive: each case fails
// at once with the dims and the bytes that are there, and memory stays small.
TEST(Idx, HugeDeclaredSizeFailsFastWithoutAllocating) {
  auto tiny = header(0x08, {0x7FFFFFFF, 1, 1});  // 2^31 - 1 bytes declared
  tiny.resize(tiny.size() + 6);                  // 22 bytes in all
  ASSERT_EQ(tiny.size(), 22u);
  // Incompressible bytes: a 1 MiB gzip file that could inflate to 1 GiB but holds 1 MiB.
  auto big = header(0x0E, {0x4000000});  // 64 Mi f64: 512 MiB declared
  for (uint32_t i = 0, x = 12345; i < (1u << 20); ++i) {
    x = x * 1664525u + 1013904223u;
    big.push_back(static_cast<unsigned char>(x >> 24));
  }
  struct Case {
    std::string name;
    const std::vector<unsigned char>* bytes;
    std::string expect;
  };
  const Case cases[] = {
      {"tiny.idx", &tiny, "expected 2147483647 bytes"},
      {"tiny.idx.gz", &tiny, "inflates to at most"},
      {"big.idx.gz", &big, "got 1048576"},
  };
  const bool can_reset = mg::testing::reset_peak_rss();
  for (const Case& c : cases) {
    const std::string path = tmp_path(c.name);
    write_bytes(path, *c.bytes);
    mg::testing::reset_peak_rss();
    const int64_t rss0 = mg::testing::rss_bytes();
    auto& stats = CategoryStats::get(Device::cpu());
    stats.reset_peak();
    const int64_t tensors0 = stats.total().current;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = message_of(path);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(dt, 1.0) << c.name;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated file"), std::string::npos) << msg;
    EXPECT_NE(msg.find("header dims ["), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    // The 1 MiB of data read doubles into at most a 2 MiB buffer; 64 MiB leaves room for the
    // allocator and zlib, far below the 512 MiB and 2 GiB declared.
    if (can_reset) EXPECT_LT(mg::testing::peak_rss_bytes() - rss0, int64_t{64} << 20) << c.name;
    // No tensor of the declared size was allocated (untouched, it would not show in the RSS).
    EXPECT_LT(stats.total().peak - tensors0, int64_t{64} << 20) << c.name;
  }
}

TEST(Idx, BadMagicIsIOError) {
  auto bytes = header(0x08, {4});
  bytes[0] = 0x1F;  // not 0x00
  bytes.resize(bytes.size() + 4);
  write_bytes(tmp_path("magic1.gz"), bytes);
  std::string msg = message_of(tmp_path("magic1.gz"));
  EXPECT_NE(msg.find("bad magic number 0x1F000801"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp_path("magic1.gz")), std::string::npos) << msg;

  auto b2 = header(0x07, {4});  // unknown type code
  b2.resize(b2.size() + 4);
  write_bytes(tmp_path("magic2.gz"), b2);
  EXPECT_NE(message_of(tmp_path("magic2.gz")).find("bad magic"), std::string::npos);

  auto b3 = header(0x08, {});  // zero dims
  write_bytes(tmp_path("magic3.gz"), b3);
  EXPECT_NE(message_of(tmp_path("magic3.gz")).find("bad magic"), std::string::npos);
}

TEST(Idx, MissingFileIsIOError) {
  std::string msg = message_of(tmp_path("does-not-exist.gz"));
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does-not-exist.gz"), std::string::npos) << msg;
}

TEST(Idx, DataIsCountedUnderTheCurrentCategory) {
  auto bytes = header(0x08, {1000});
  bytes.resize(bytes.size() + 1000);
  write_bytes(tmp_path("cat.gz"), bytes);
  auto& stats = CategoryStats::get(Device::cpu());
  const int64_t before = stats.counter(MemoryCategory::Data).current;
  MemoryCategoryGuard g(MemoryCategory::Data);
  Tensor t = read_idx(tmp_path("cat.gz"));
  EXPECT_EQ(stats.counter(MemoryCategory::Data).current - before, 1000);
}

}  // namespace
}  // namespace mg::data
