#include "serialize/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

namespace mg::serialize {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian data");

namespace {

using nlohmann::json;

constexpr const char* kMetaKey = "memgrad.meta";
// safetensors refuses larger headers too; it bounds what a corrupt length can make us allocate.
constexpr uint64_t kMaxHeader = 100u << 20;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {{DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
                                 {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u8, "U8"},   {DType::b8, "BOOL"}};

// --- reading -------------------------------------------------------------------------------

// Where the bytes come from: a file (pread) or a buffer; both go through the same checks.
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly n bytes at off (the caller has checked the range).
  virtual void read(uint64_t off, void* dst, size_t n) const = 0;
  const std::string& name() const { return name_; }

 protected:
  explicit Source(std::string name) : name_(std::move(name)) {}
  std::string name_;
};

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : Source(path) {
    fd_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MG_CHECK(fd_.fd >= 0, IOError, "load(", path, "): cannot open: ", std::strerror(errno));
    struct stat st;
    MG_CHECK(::fstat(fd_.fd, &st) == 0, IOError, "load(", path, "): fstat failed: ", std::strerror(errno));
    MG_CHECK(S_ISREG(st.st_mode), IOError, "load(", path, "): not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
  }
  uint64_t size() const override { return size_; }
  void read(uint64_t off, void* dst, size_t n) const override {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd_.fd, p, n, static_cast<off_t>(off));
      if (got < 0 && errno == EINTR) continue;
      MG_CHECK(got > 0, IOError, "load(", name_, "): read failed at byte ", off, ": ",
               got == 0 ? "unexpected end of file (was it truncated while being read?)" : std::strerror(errno));
      p += got;
      off += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
  }

 private:
  UniqueFd fd_;
  uint64_t size_ = 0;
};

class BufferSource : public Source {
 public:
  BufferSource(const std::string& bytes, std::string name) : Source(std::move(name)), bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t off, void* dst, size_t n) const override {
    if (n) std::memcpy(dst, bytes_.data() + off, n);
  }

 private:
  const std::string& bytes_;
};

struct Entry {
  std::string key;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Parses the header, rejecting duplicate keys at any level (plain json::parse keeps the last).
json parse_header(const std::string& text, const std::string& where) {
  std::vector<std::vector<std::string>> keys;  // one list per open object
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    MG_CHECK(depth <= 4, IOError, where, ": header nests deeper than the format allows");
    if (ev == json::parse_event_t::object_start)
      keys.emplace_back();
    else if (ev == json::parse_event_t::object_end)
      keys.pop_back();
    else if (ev == json::parse_event_t::key) {
      const std::string k = parsed.get<std::string>();
      MG_CHECK(std::find(keys.back().begin(), keys.back().end(), k) == keys.back().end(), IOError, where,
               ": duplicate key \"", k, "\" in the header");
      keys.back().push_back(k);
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::exception& e) {
    MG_THROW(IOError, where, ": header is not valid JSON: ", e.what());
  }
}

uint64_t as_index(const json& v, const std::string& where, const std::string& key, const char* field) {
  MG_CHECK(v.is_number_unsigned(), IOError, where, ": tensor \"", key, "\": ", field,
           " must hold non-negative integers, got ", v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& key, const json& info, const std::string& where) {
  MG_CHECK(info.is_object(), IOError, where, ": tensor \"", key, "\": header entry must be an object, got ",
           info.dump());
  for (auto& [field, v] : info.items())
    MG_CHECK(field == "dtype" || field == "shape" || field == "data_offsets", IOError, where, ": tensor \"", key,
             "\": unknown field \"", field, "\"");
  MG_CHECK(info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"), IOError, where,
           ": tensor \"", key, "\": entry needs dtype, shape and data_offsets, got ", info.dump());
  Entry e{key, DType::f32, {}, 0, 0};
  const json& dt = info["dtype"];
  MG_CHECK(dt.is_string(), IOError, where, ": tensor \"", key, "\": dtype must be a string, got ", dt.dump());
  const std::string dts = dt.get<std::string>();
  bool known = false;
  for (auto& d : kDTypes)
    if (dts == d.name) {
      e.dtype = d.dtype;
      known = true;
    }
  MG_CHECK(known, IOError, where, ": tensor \"", key, "\": unsupported dtype \"", dts,
           "\" (memgrad reads F64 F32 F16 BF16 I64 I32 U8 BOOL)");
  const json& shape = info["shape"];
  MG_CHECK(shape.is_array() && shape.size() <= 64, IOError, where, ": tensor \"", key,
           "\": shape must be an array of at most 64 dims, got ", shape.dump());
  uint64_t numel = 1;
  int64_t span = 1;  // product of the nonzero dims: strides must fit in int64 even when numel is 0
  bool overflow = false;
  for (auto& d : shape) {
    uint64_t n = as_index(d, where, key, "shape");
    MG_CHECK(n <= static_cast<uint64_t>(INT64_MAX) &&
                 (n == 0 || !__builtin_mul_overflow(span, static_cast<int64_t>(n), &span)),
             IOError, where, ": tensor \"", key, "\": shape ", shape.dump(), " is too large");
    e.shape.push_back(static_cast<int64_t>(n));
    overflow |= __builtin_mul_overflow(numel, n, &numel);
  }
  const json& off = info["data_offsets"];
  MG_CHECK(off.is_array() && off.size() == 2, IOError, where, ": tensor \"", key,
           "\": data_offsets must be [begin, end], got ", off.dump());
  e.begin = as_index(off[0], where, key, "data_offsets");
  e.end = as_index(off[1], where, key, "data_offsets");
  MG_CHECK(e.begin <= e.end, IOError, where, ": tensor \"", key, "\": data_offsets [", e.begin, ", ", e.end,
           "] end before they begin");
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &nbytes);
  MG_CHECK(!overflow && nbytes == e.end - e.begin, IOError, where, ": tensor \"", key, "\": dtype ", dts, " shape ",
           shape.dump(), overflow ? " overflows 64-bit byte counts" : " needs " + std::to_string(nbytes) + " bytes",
           " but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
  return e;
}

StateDict load_source(const Source& src, Device device) {
  const std::string where = "load(" + src.name() + ")";
  const uint64_t size = src.size();
  MG_CHECK(size >= 8, IOError, where, ": truncated: ", size,
           " bytes, but a safetensors file starts with an 8-byte header length");
  uint64_t n = 0;
  src.read(0, &n, 8);
  MG_CHECK(n <= size - 8, IOError, where, ": header length ", n, " runs past the end of the file (", size, " bytes)");
  MG_CHECK(n <= kMaxHeader, IOError, where, ": header length ", n, " exceeds the ", kMaxHeader, "-byte limit");
  std::string text(n, '\0');
  src.read(8, text.data(), n);
  const json header = parse_header(text, where);
  MG_CHECK(header.is_object(), IOError, where, ": header must be a JSON object, got ", header.type_name());

  StateDict out;
  std::vector<Entry> entries;
  for (auto& [key, info] : header.items()) {
    if (key != "__metadata__") {
      entries.push_back(parse_entry(key, info, where));
      continue;
    }
    MG_CHECK(info.is_object(), IOError, where, ": __metadata__ must be an object of strings, got ", info.dump());
    for (auto& [k, v] : info.items())
      MG_CHECK(v.is_string(), IOError, where, ": __metadata__[\"", k, "\"] must be a string, got ", v.dump());
    if (info.contains(kMetaKey)) {
      try {
        out.meta = json::parse(info[kMetaKey].get<std::string>());
      } catch (const json::exception& e) {
        MG_THROW(IOError, where, ": __metadata__[\"", kMetaKey, "\"] is not valid JSON: ", e.what());
      }
    }
  }

  // The tensors must tile the data section exactly, as safetensors checks: no overlap, no
  // gap, nothing past the end of the file.
  const uint64_t data_size = size - 8 - n;
  std::vector<const Entry*> order;
  for (auto& e : entries) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    MG_CHECK(e->end <= data_size, IOError, where, ": tensor \"", e->key, "\": data_offsets [", e->begin, ", ", e->end,
             "] run past the data section (", data_size, " bytes; truncated file?)");
    MG_CHECK(e->begin >= at, IOError, where, ": tensor \"", e->key, "\": data_offsets [", e->begin, ", ", e->end,
             "] overlap tensor \"", prev ? prev->key : "", "\" (which ends at ", at, ")");
    MG_CHECK(e->begin == at, IOError, where, ": tensor \"", e->key, "\": data_offsets start at ", e->begin,
             ", leaving a gap after byte ", at);
    at = e->end;
    prev = e;
  }
  MG_CHECK(at == data_size, IOError, where, ": the tensors cover ", at, " bytes of the data section but it holds ",
           data_size, " (trailing bytes or a missing tensor)");

  for (auto& e : entries) {
    Tensor t = empty(e.shape, {e.dtype, Device::cpu()});
    if (e.end > e.begin) src.read(8 + n + e.begin, t.raw_data(), e.end - e.begin);
    if (e.dtype == DType::b8) {
      const auto* b = static_cast<const uint8_t*>(t.raw_data());
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        MG_CHECK(b[i] <= 1, IOError, where, ": tensor \"", e.key, "\": BOOL element ", i, " holds byte ",
                 static_cast<int>(b[i]), " (must be 0 or 1)");
    }
    out.tensors[e.key] = device.is_cpu() ? t : raw::to_device(t, device);
  }
  return out;
}

// --- writing -------------------------------------------------------------------------------

// Streams the file: header, then each tensor as it is brought to the host.
void write_safetensors(const StateDict& dict, const ByteSink& sink) {
  json header = json::object();
  std::vector<std::pair<const std::string*, Tensor>> order;
  for (auto& [key, t] : dict.tensors) {
    MG_CHECK(key != "__metadata__", ValueError, "save: \"__metadata__\" cannot name a tensor");
    MG_CHECK(t.defined(), ValueError, "save: tensor \"", key, "\" is undefined");
    order.emplace_back(&key, t);
  }
  // Widest elements first (then by name), as safetensors' own writer orders them: with the data
  // section 8-byte aligned and no padding allowed between tensors, every tensor is then aligned
  // to its element size, so readers can map it in place.
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.element_size() > b.second.element_size(); });
  uint64_t at = 0;
  for (auto& [keyp, t] : order) {
    const std::string& key = *keyp;
    const uint64_t nb = t.nbytes();
    header[key] = {{"dtype", safetensors_dtype(t.dtype())}, {"shape", t.sizes()}, {"data_offsets", {at, at + nb}}};
    at += nb;
  }
  header["__metadata__"] = {{"format", "pt"}};
  if (!dict.meta.is_null() && !(dict.meta.is_object() && dict.meta.empty()))
    header["__metadata__"][kMetaKey] = dict.meta.dump();
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    MG_THROW(ValueError, "save: a tensor name or the meta data is not valid UTF-8: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as safetensors writes it
  const uint64_t n = text.size();
  sink(&n, 8);
  sink(text.data(), text.size());
  for (auto& [key, t] : order) {
    Tensor h = t.is_cuda() ? raw::to_device(t, Device::cpu()) : t;
    h = raw::contiguous(h);
    if (h.nbytes()) sink(h.raw_data(), h.nbytes());
  }
}

}  // namespace

const char* safetensors_dtype(DType t) {
  for (auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  MG_THROW(DTypeError, "safetensors_dtype: no safetensors dtype for ", t);
}

void save(const StateDict& dict, const std::string& path) {
  write_file_atomically(path, [&](const ByteSink& sink) { write_safetensors(dict, sink); });
}

StateDict load(const std::string& path, Device device) { return load_source(FileSource(path), device); }

std::string save_to_bytes(const StateDict& dict) {
  std::string out;
  write_safetensors(dict, [&](const void* data, size_t n) { out.append(static_cast<const char*>(data), n); });
  return out;
}

StateDict load_from_bytes(const std::string& bytes, Device device, const std::string& source) {
  return load_source(BufferSource(bytes, source), device);
}

}  // namespace mg::serialize
