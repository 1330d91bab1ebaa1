// Damage for safetensors files, for the loader fuzz tests: byte-level (bit flips, truncation,
// splices, header-length edits, rewritten numbers) and structural (the JSON header parsed, one
// entry or the metadata changed to something hostile, written back with a matching length):
// huge or negative dims, overlapping and out-of-range offsets, unknown dtypes, missing and extra
// fields, non-object headers, deep nesting, bad metadata.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fuzz.h"

namespace mg::testing {

struct SafetensorsParts {
  std::string header;  // the JSON text
  std::string data;    // everything after it
};

inline bool split_safetensors(const std::string& file, SafetensorsParts* out) {
  if (file.size() < 8) return false;
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  if (n > file.size() - 8) return false;
  out->header = file.substr(8, n);
  out->data = file.substr(8 + n);
  return true;
}

inline std::string join_safetensors(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// A value a field should never hold.
inline nlohmann::json hostile_value(Mutator& m) {
  using nlohmann::json;
  switch (m.below(14)) {
    case 0:
      return nullptr;
    case 1:
      return -1;
    case 2:
      return 1.5;
    case 3:
      return "x";
    case 4:
      return json::array();
    case 5:
      return json::object();
    case 6:
      return uint64_t{0xFFFFFFFFFFFFFFFFull};
    case 7:
      return uint64_t{1} << 63;
    case 8:
      return (uint64_t{1} << 62) + m.below(4);
    case 9:
      return uint64_t{0x7FFFFFFFFFFFFFFFull};
    case 10:
      return uint64_t{1} << 32;
    case 11:
      return 1e308;
    case 12:
      return m.below(64);
    default:
      return json::array({m.below(8), json::array({1})});
  }
}

// Changes one thing in the parsed header `h` (an object of tensor entries and __metadata__).
inline void mutate_header_json(nlohmann::json& h, Mutator& m, uint64_t data_size) {
  using nlohmann::json;
  std::vector<std::string> keys;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") keys.push_back(k);
  const std::string key = keys.empty() ? std::string("t") : keys[m.below(keys.size())];
  json& e = h[key];
  if (!e.is_object()) e = json::object();
  switch (m.below(12)) {
    case 0: {  // a dim: huge, zero, negative, not a number
      if (!e["shape"].is_array() || e["shape"].empty()) e["shape"] = json::array({1});
      e["shape"][m.below(e["shape"].size())] = hostile_value(m);
      break;
    }
    case 1: {  // a shape whose element count overflows but whose zero dim keeps bytes at 0
      e["shape"] = json::array({uint64_t{1} << 40, uint64_t{1} << 40, m.below(2)});
      break;
    }
    case 2:  // many dims
      e["shape"] = json::array();
      for (uint64_t i = 0, n = 1 + m.below(80); i < n; ++i) e["shape"].push_back(1 + m.below(2));
      break;
    case 3: {  // offsets out of range, reversed, huge
      uint64_t b = m.below(data_size + 16), en = m.below(3) == 0 ? b - 1 : b + m.below(64);
      if (m.below(4) == 0) en = uint64_t{0xFFFFFFFFFFFFFFFFull} - m.below(3);
      e["data_offsets"] = json::array({b, en});
      break;
    }
    case 4: {  // overlap another tensor's bytes exactly or partly
      const std::string other = keys.empty() ? key : keys[m.below(keys.size())];
      if (h[other].is_object() && h[other]["data_offsets"].is_array()) {
        e["data_offsets"] = h[other]["data_offsets"];
        if (m.below(2) && e["data_offsets"].size() == 2 && e["data_offsets"][1].is_number_unsigned())
          e["data_offsets"][1] = e["data_offsets"][1].get<uint64_t>() + 1;
      }
      break;
    }
    case 5:  // an offsets field of the wrong form
      e["data_offsets"] = m.below(2) ? hostile_value(m) : json::array({0, 1, 2});
      break;
    case 6: {  // dtype
      const char* names[] = {"F8_E4M3", "f32", "", "I16", "U64", "BOOL", "F16", "C64"};
      e["dtype"] = m.below(4) ? json(names[m.below(8)]) : hostile_value(m);
      break;
    }
    case 7: {  // a missing or an extra field
      const char* fields[] = {"dtype", "shape", "data_offsets"};
      if (m.below(2))
        e.erase(fields[m.below(3)]);
      else
        e["extra"] = hostile_value(m);
      break;
    }
    case 8: {  // odd keys
      const std::string names[] = {"", "\xff\xfe", std::string("a\0b", 3), std::string(300, 'k'), "__metadata__"};
      h[names[m.below(5)]] = e;
      break;
    }
    case 9: {  // metadata of the wrong form
      json& md = h["__metadata__"];
      if (!md.is_object()) md = json::object();
      switch (m.below(4)) {
        case 0:
          md = hostile_value(m);
          break;
        case 1:
          md["k"] = hostile_value(m);
          break;
        case 2:
          md["memgrad.meta"] = std::string("{\"a\":") + std::string(m.below(2) ? 3 : 20000, '[');
          break;
        default:
          md["memgrad.meta"] = std::string(m.below(2) ? "[1,2" : "nan");
      }
      break;
    }
    case 10:  // the entry replaced by something that is no entry
      e = hostile_value(m);
      break;
    default:  // the whole header something other than an object
      h = m.below(2) ? hostile_value(m) : json::array({h});
  }
}

// One damaged copy of the safetensors file `valid`.
inline std::string mutate_safetensors(const std::string& valid, Mutator& m) {
  SafetensorsParts p;
  if (!split_safetensors(valid, &p)) return valid;
  const size_t hn = p.header.size();
  std::string b = valid;
  const uint64_t kind = m.below(10);
  if (kind < Mutator::kByteDamages) {
    m.damage_bytes(b, kind, 8, 8 + hn);
    return b;
  }
  switch (kind) {
    case 5: {  // the header-length field
      uint64_t v = m.below(3) == 0 ? m.rng()() : hn + m.below(17) - 8;
      if (m.below(4) == 0) v = uint64_t{0xFFFFFFFFFFFFFFFFull} - m.below(16);
      std::memcpy(b.data(), &v, 8);
      break;
    }
    case 6: {  // rewrite a number in the header text
      const size_t at = p.header.find_first_of("0123456789", m.below(hn));
      if (at != std::string::npos) {
        const char* repl[] = {"0",  "9",   "4294967296",         "18446744073709551615", "99999999999999999999",
                              "-1", "1.5", "9223372036854775808"};
        p.header.replace(at, 1, repl[m.below(8)]);
      }
      b = join_safetensors(p.header, p.data);
      break;
    }
    case 7: {  // the data section: bit flips (BOOL bytes among them)
      m.flip_bits(b, 8 + hn);
      break;
    }
    default: {  // structural: parse, change, write back with a matching length
      nlohmann::json h = nlohmann::json::parse(p.header);
      const int edits = 1 + static_cast<int>(m.below(2));
      for (int i = 0; i < edits && h.is_object(); ++i) mutate_header_json(h, m, p.data.size());
      std::string text;
      try {
        text = h.dump();
      } catch (const nlohmann::json::exception&) {
        text = h.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // invalid UTF-8 in a key
      }
      if (m.below(4) == 0) text.append(m.below(9), ' ');
      b = join_safetensors(text, p.data);
    }
  }
  return b;
}

}  // namespace mg::testing
