#include "data/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mg::data {

namespace {

struct CodePointRange {
  char32_t lo, hi;
};
#include "data/unicode_classes.inc"

template <size_t N>
bool in_ranges(const CodePointRange (&table)[N], char32_t c) {
  auto it = std::upper_bound(std::begin(table), std::end(table), c,
                             [](char32_t v, const CodePointRange& r) { return v < r.lo; });
  return it != std::begin(table) && c <= std::prev(it)->hi;
}

// Unicode's White_Space property (what \s matches in the pattern).
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

enum class Kind { Letter, Number, Space, Other };

struct CodePoint {
  char32_t c;
  size_t begin;  // byte offset in the text
  Kind kind;
};

// Decodes UTF-8; a byte that does not start a valid sequence is one code point of its own
// (kind Other), so every byte of the text lands in exactly one piece.
std::vector<CodePoint> decode_utf8(const std::string& s) {
  std::vector<CodePoint> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    char32_t c = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    for (size_t k = 1; k < len; ++k) {
      const auto cb = i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0;
      if ((cb & 0xC0) != 0x80) {
        len = 0;
        break;
      }
      c = (c << 6) | (cb & 0x3F);
    }
    if (len == 0) {
      out.push_back({b, i, Kind::Other});
      ++i;
      continue;
    }
    const Kind kind = in_ranges(kLetterRanges, c)   ? Kind::Letter
                      : in_ranges(kNumberRanges, c) ? Kind::Number
                      : is_space(c)                 ? Kind::Space
                                                    : Kind::Other;
    out.push_back({c, i, kind});
    i += len;
  }
  return out;
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

void check_id(int64_t id, int64_t vocab, const char* who) {
  MG_CHECK(id >= 0 && id < vocab, IndexError, who, "::decode: token id ", id, " is outside [0, ", vocab, ")");
}

}  // namespace

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int64_t id : ids) {
    check_id(id, 256, "ByteTokenizer");
    s += static_cast<char>(id);
  }
  return s;
}

const std::vector<std::string>& GPT2Tokenizer::byte_encoder() {
  // OpenAI's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
  // take the code points 256, 257, ... in byte order (so no symbol holds a space or control).
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = utf8(printable ? static_cast<char32_t>(b) : next++);
    }
    return t;
  }();
  return table;
}

std::vector<std::string> GPT2Tokenizer::pre_tokenize(const std::string& text) {
  const std::vector<CodePoint> cps = decode_utf8(text);
  const size_t n = cps.size();
  std::vector<std::string> pieces;
  auto emit = [&](size_t a, size_t b) {  // code points [a, b)
    const size_t end = b < n ? cps[b].begin : text.size();
    pieces.push_back(text.substr(cps[a].begin, end - cps[a].begin));
  };
  auto run = [&](size_t i, Kind k) {  // end of the run of kind k starting at i
    while (i < n && cps[i].kind == k) ++i;
    return i;
  };
  auto at = [&](size_t i, char32_t c) { return i < n && cps[i].c == c; };
  for (size_t i = 0; i < n;) {
    // 's|'t|'re|'ve|'m|'ll|'d (in this order, case-sensitive)
    if (cps[i].c == '\'') {
      size_t len = 0;
      if (at(i + 1, 's') || at(i + 1, 't') || at(i + 1, 'm') || at(i + 1, 'd'))
        len = 2;
      else if ((at(i + 1, 'r') && at(i + 2, 'e')) || (at(i + 1, 'v') && at(i + 2, 'e')) ||
               (at(i + 1, 'l') && at(i + 2, 'l')))
        len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional single space, then a run.
    const size_t s = cps[i].c == ' ' && i + 1 < n && cps[i + 1].kind != Kind::Space ? i + 1 : i;
    if (cps[s].kind != Kind::Space) {
      const size_t e = run(s, cps[s].kind);
      emit(i, e);
      i = e;
      continue;
    }
    // '\s+(?!\S)': whitespace not followed by a non-space, i.e. all of a run at the end of the
    // text, else the run less its last character (which then leads the next piece); '\s+' for
    // a lone whitespace character before a non-space.
    const size_t e = run(i, Kind::Space);
    const size_t stop = e == n || e - i == 1 ? e : e - 1;
    emit(i, stop);
    i = stop;
  }
  return pieces;
}

GPT2Tokenizer::GPT2Tokenizer(std::map<std::string, int64_t> encoder,
                             std::vector<std::pair<std::string, std::string>> merges)
    : encoder_(std::move(encoder)) {
  int64_t vocab = 0;
  for (const auto& [sym, id] : encoder_) {
    MG_CHECK(id >= 0 && id < (int64_t{1} << 31), ValueError, "GPT2Tokenizer: symbol \"", sym, "\" has id ", id,
             " (ids must be in [0, 2^31))");
    vocab = std::max(vocab, id + 1);
  }
  decoder_.assign(static_cast<size_t>(vocab), "");
  for (const auto& [sym, id] : encoder_) decoder_[static_cast<size_t>(id)] = sym;
  for (size_t r = 0; r < merges.size(); ++r)
    ranks_.emplace(merges[r].first + " " + merges[r].second, static_cast<int64_t>(r));
  const auto& be = byte_encoder();
  for (int b = 0; b < 256; ++b) {
    byte_of_[be[b]] = static_cast<uint8_t>(b);
    MG_CHECK(encoder_.count(be[b]), ValueError, "GPT2Tokenizer: the encoder has no symbol for byte ", b, " (\"", be[b],
             "\"), so some texts could not be encoded");
  }
}

std::unique_ptr<GPT2Tokenizer> GPT2Tokenizer::from_files(const std::string& encoder_json,
                                                         const std::string& vocab_bpe) {
  std::ifstream ej(encoder_json);
  MG_CHECK(ej, IOError, "GPT2Tokenizer: cannot open ", encoder_json);
  std::map<std::string, int64_t> encoder;
  try {
    const nlohmann::json j = nlohmann::json::parse(ej);
    MG_CHECK(j.is_object(), IOError, "GPT2Tokenizer: ", encoder_json, " is not a JSON object of symbol -> id");
    for (const auto& [sym, id] : j.items()) {
      MG_CHECK(id.is_number_integer(), IOError, "GPT2Tokenizer: ", encoder_json, ": the id of \"", sym,
               "\" is not an integer");
      encoder.emplace(sym, id.get<int64_t>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw IOError("GPT2Tokenizer: " + encoder_json + " is not valid JSON: " + e.what());
  }
  std::ifstream vb(vocab_bpe);
  MG_CHECK(vb, IOError, "GPT2Tokenizer: cannot open ", vocab_bpe);
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (int64_t lineno = 1; std::getline(vb, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    MG_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
             IOError, "GPT2Tokenizer: ", vocab_bpe, " line ", lineno, ": expected \"first second\", got \"", line,
             "\"");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return std::make_unique<GPT2Tokenizer>(std::move(encoder), std::move(merges));
}

std::vector<std::string> GPT2Tokenizer::bpe(const std::string& symbols) const {
  std::vector<std::string> word;
  for (const CodePoint& cp : decode_utf8(symbols)) word.push_back(utf8(cp.c));
  while (word.size() > 1) {
    // The adjacent pair of lowest rank; merge every occurrence of it, left to right.
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = ranks_.find(word[i] + " " + word[i + 1]);
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[at], second = word[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        ++i;
      } else {
        merged.push_back(word[i]);
      }
    }
    word = std::move(merged);
  }
  return word;
}

std::vector<int64_t> GPT2Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  const auto& be = byte_encoder();
  for (const std::string& piece : pre_tokenize(text)) {
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = cache_.find(piece);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    std::string symbols;
    for (char ch : piece) symbols += be[static_cast<unsigned char>(ch)];
    std::vector<int64_t> piece_ids;
    for (const std::string& sym : bpe(symbols)) {
      auto it = encoder_.find(sym);
      MG_CHECK(it != encoder_.end(), ValueError, "GPT2Tokenizer::encode: the merges make \"", sym,
               "\", which the encoder does not list (encoder.json and vocab.bpe do not belong together)");
      piece_ids.push_back(it->second);
    }
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    cache_.emplace(piece, std::move(piece_ids));
  }
  return ids;
}

std::string GPT2Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    check_id(id, vocab_size(), "GPT2Tokenizer");
    const std::string& sym = decoder_[static_cast<size_t>(id)];
    for (const CodePoint& cp : decode_utf8(sym)) {
      auto it = byte_of_.find(utf8(cp.c));
      MG_CHECK(it != byte_of_.end(), ValueError, "GPT2Tokenizer::decode: symbol \"", sym, "\" of id ", id,
               " holds a character that stands for no byte");
      out += static_cast<char>(it->second);
    }
  }
  return out;
}

}  // namespace mg::data
