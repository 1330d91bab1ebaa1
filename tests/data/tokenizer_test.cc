// Byte and GPT-2 BPE tokenizers. The BPE expectations come from OpenAI's encoder.py algorithm
// run on the fixture (tests/data/fixtures/gpt2_bpe/make_fixture.py prints them); the fixture's
// byte symbols carry GPT-2's real ids and its first seven merges are GPT-2's, so " the" = 262.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/source_path.h"
#include "core/error.h"
#include "data/tokenizer.h"

namespace {

using mg::data::ByteTokenizer;
using mg::data::GPT2Tokenizer;
using Ids = std::vector<int64_t>;

std::string fixture(const std::string& name) { return mg::test::source_path("tests/data/fixtures/gpt2_bpe/" + name); }

std::unique_ptr<GPT2Tokenizer> fixture_tokenizer() {
  return GPT2Tokenizer::from_files(fixture("encoder.json"), fixture("vocab.bpe"));
}

TEST(ByteTokenizer, EveryByteRoundTrips) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const Ids ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(ids[255], 255);  // bytes are unsigned ids, never negative chars
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_THROW(tok.decode({256}), mg::IndexError);
}

TEST(GPT2Tokenizer, ByteToUnicodeMapping) {
  const auto& be = GPT2Tokenizer::byte_encoder();
  EXPECT_EQ(be['A'], "A");
  EXPECT_EQ(be['!'], "!");
  EXPECT_EQ(be[' '], "\u0120");   // Ġ: 256 + 32 (the 33rd non-printable byte)
  EXPECT_EQ(be['\n'], "\u010A");  // Ċ: 256 + 10
  EXPECT_EQ(be[0], "\u0100");
  EXPECT_EQ(be[0xAD], "\u0143");  // soft hyphen: the last of the 68 remapped bytes
  EXPECT_EQ(be[0xE9], "\u00E9");  // printable Latin-1 stands for itself
}

TEST(GPT2Tokenizer, PreTokenizeSplitsContractionsSpacesDigitsPunctuation) {
  using P = std::vector<std::string>;
  EXPECT_EQ(GPT2Tokenizer::pre_tokenize("the cat's in there"), (P{"the", " cat", "'s", " in", " there"}));
  EXPECT_EQ(GPT2Tokenizer::pre_tokenize("Hello,  world!\n\n 123 4.5\u00e9"),
            (P{"Hello", ",", " ", " world", "!", "\n\n", " 123", " 4", ".", "5", "\u00e9"}));
  EXPECT_EQ(GPT2Tokenizer::pre_tokenize("I'll   we've\t'tis worll ??"),
            (P{"I", "'ll", "  ", " we", "'ve", "\t", "'t", "is", " worll", " ??"}));
  EXPECT_EQ(GPT2Tokenizer::pre_tokenize("  x  "), (P{" ", " x", "  "}));
  // Letters and digits of other scripts (\p{L}, \p{N}), and a byte that is not UTF-8.
  EXPECT_EQ(GPT2Tokenizer::pre_tokenize("\u0416\u0438\u0442\u044C \u0663\u0664!"),
            (P{"\u0416\u0438\u0442\u044C", " \u0663\u0664", "!"}));
  EXPECT_EQ(GPT2Tokenizer::pre_tokenize(std::string("a\xff") + "b"), (P{"a", "\xff", "b"}));
}

TEST(GPT2Tokenizer, EncodesToTheIdsOfTheGPT2Algorithm) {
  auto tok = fixture_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 256 + 21);
  // " cat": "c a" (rank 16) merges before "Ġ c" (18), and no "Ġ ca" merge exists: [Ġ, ca, t].
  EXPECT_EQ(tok->encode("the cat's in there"), (Ids{83, 258, 220, 272, 83, 263, 220, 259, 262, 260}));
  EXPECT_EQ(tok->encode("Hello,  world!\n\n 123 4.5\u00e9"),
            (Ids{39, 68, 264, 78, 11, 220, 267, 75, 67, 0, 198, 198, 220, 269, 18, 220, 19, 13, 20, 276}));
  EXPECT_EQ(tok->encode("I'll   we've\t'tis worll ??"),
            (Ids{40, 6, 264, 270, 265, 68, 6, 85, 68, 197, 6, 83, 72, 82, 268, 220, 30, 30}));
  EXPECT_EQ(tok->encode("  x  "), (Ids{220, 220, 87, 270}));
  EXPECT_EQ(tok->encode(" the"), (Ids{262}));  // GPT-2's own id for " the"
}

TEST(GPT2Tokenizer, DecodeInvertsEncodeOnAnyBytes) {
  auto tok = fixture_tokenizer();
  std::string all;
  for (int b = 255; b >= 0; --b) all += static_cast<char>(b);
  for (const std::string& s : {std::string("the cat's in there"), std::string("\u00e9t\u00e9 \u0663 x\t\n  "), all})
    EXPECT_EQ(tok->decode(tok->encode(s)), s);
  EXPECT_THROW(tok->decode({tok->vocab_size()}), mg::IndexError);
}

TEST(GPT2Tokenizer, BadFilesAreIOErrors) {
  EXPECT_THROW(GPT2Tokenizer::from_files("/nonexistent/encoder.json", fixture("vocab.bpe")), mg::IOError);
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string bad = std::string(dir ? dir : "/tmp") + "/bad_vocab.bpe";
  std::ofstream(bad) << "#version: 0.2\nonlyone\n";
  EXPECT_THROW(GPT2Tokenizer::from_files(fixture("encoder.json"), bad), mg::IOError);
  const std::string bad_json = std::string(dir ? dir : "/tmp") + "/bad_encoder.json";
  std::ofstream(bad_json) << "{\"a\": ";
  EXPECT_THROW(GPT2Tokenizer::from_files(bad_json, fixture("vocab.bpe")), mg::IOError);
  // An encoder without every byte's symbol cannot encode all texts.
  EXPECT_THROW(GPT2Tokenizer({{"a", 0}}, {}), mg::ValueError);
}

}  // namespace
