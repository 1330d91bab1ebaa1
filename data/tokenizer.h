// Text to token ids and back: bytes as tokens (ByteTokenizer, 256 ids), and GPT-2's byte-level
// byte-pair encoding read from the encoder.json and vocab.bpe files OpenAI and Hugging Face ship.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mg::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // Ids outside [0, vocab_size()) are an mg::IndexError naming the id.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
};

// Every byte is its own token: vocab 256, any byte string round-trips.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "bytes"; }
};

// GPT-2's tokenizer (OpenAI's encoder.py): the text is split by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// each piece's bytes become printable stand-in characters (bytes_to_unicode), and the merges
// of vocab.bpe are applied lowest rank first; encoder.json maps the merged symbols to ids.
class GPT2Tokenizer : public Tokenizer {
 public:
  // encoder: symbol (UTF-8 of stand-in characters) -> id; merges in rank order.
  GPT2Tokenizer(std::map<std::string, int64_t> encoder, std::vector<std::pair<std::string, std::string>> merges);
  // Reads the two files; a missing file, bad JSON or a malformed merge line is an mg::IOError
  // naming the file (and the line).
  static std::unique_ptr<GPT2Tokenizer> from_files(const std::string& encoder_json, const std::string& vocab_bpe);

  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  std::string name() const override { return "gpt2-bpe"; }

  // The pieces GPT-2's pattern splits `text` into (byte substrings; bytes that are not UTF-8
  // count as punctuation).
  static std::vector<std::string> pre_tokenize(const std::string& text);
  // UTF-8 of the stand-in character for each byte ('A' -> "A", ' ' -> "Ġ", '\n' -> "Ċ").
  static const std::vector<std::string>& byte_encoder();
  // The merged symbols of one piece's stand-in string, in order.
  std::vector<std::string> bpe(const std::string& symbols) const;

 private:
  std::map<std::string, int64_t> encoder_;
  std::vector<std::string> decoder_;                  // id -> symbol ("" where no symbol has that id)
  std::unordered_map<std::string, int64_t> ranks_;    // "first second" -> merge rank
  std::unordered_map<std::string, uint8_t> byte_of_;  // stand-in character -> byte
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;  // piece -> ids
};

}  // namespace mg::data
