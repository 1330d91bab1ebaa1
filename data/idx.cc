#include "data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace mg::data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads up to n bytes, stopping early only at the end of the stream; returns how many arrived.
// A damaged stream raises; `what` names the part of the file, `expected` its full size.
size_t read_some(gzFile f, const std::string& path, void* dst, size_t n, size_t already, size_t expected,
                 const std::string& what) {
  auto* p = static_cast<unsigned char*>(dst);
  size_t got = 0;
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, p + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      MG_CHECK(errnum != Z_BUF_ERROR, IOError, "read_idx: ", path, ": truncated file: expected ", expected,
               " bytes of ", what, ", got ", already + got, " (the compressed stream ends early)");
      MG_THROW(IOError, "read_idx: ", path, ": corrupt or unreadable while reading ", what, " (",
               errnum == Z_ERRNO ? std::strerror(errno) : msg, ")");
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

void read_exact(gzFile f, const std::string& path, void* dst, size_t n, const std::string& what) {
  const size_t got = read_some(f, path, dst, n, 0, n, what);
  MG_CHECK(got == n, IOError, "read_idx: ", path, ": truncated file: expected ", n, " bytes of ", what, ", got ", got);
}

// Deflate's largest expansion: 258-byte matches coded in 2 bits each give about 1032:1.
constexpr size_t kMaxInflate = 1032;

// Reads the n data bytes into a buffer that grows as they arrive (doubling from 1 MiB), so a
// header that declares more than the stream holds fails at the end of the stream, not with an
// allocation of the declared size.
std::vector<unsigned char> read_growing(gzFile f, const std::string& path, size_t n, const std::string& what) {
  std::vector<unsigned char> buf;
  size_t got = 0;
  while (got < n) {
    buf.resize(std::min(n, std::max<size_t>(size_t{1} << 20, 2 * got)));
    const size_t r = read_some(f, path, buf.data() + got, buf.size() - got, got, n, what);
    got += r;
    if (got < buf.size()) break;  // end of stream
  }
  MG_CHECK(got == n, IOError, "read_idx: ", path, ": truncated file: expected ", n, " bytes of ", what, ", got ", got);
  return buf;
}

// The IDX element types: the type code (third magic byte), bytes per element in the file, and
// the dtype it is held as in memory. write_idx writes the row whose file size is the dtype's.
struct TypeInfo {
  uint8_t code;
  int file_size;
  DType dtype;
};
constexpr TypeInfo kTypes[] = {
    {0x08, 1, DType::u8},   // unsigned byte
    {0x09, 1, DType::i32},  // signed byte
    {0x0B, 2, DType::i32},  // short
    {0x0C, 4, DType::i32},  // int
    {0x0D, 4, DType::f32},  // float
    {0x0E, 8, DType::f64},  // double
};

const TypeInfo* type_of_code(uint8_t code) {
  for (const TypeInfo& t : kTypes)
    if (t.code == code) return &t;
  return nullptr;
}
const TypeInfo* type_for_dtype(DType dtype) {
  for (const TypeInfo& t : kTypes)
    if (t.dtype == dtype && t.file_size == static_cast<int>(dtype_size(dtype))) return &t;
  return nullptr;
}

uint32_t be32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

template <class T>
T load_be(const unsigned char* b, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | b[i];
  if constexpr (std::is_same_v<T, float>) {
    uint32_t u = static_cast<uint32_t>(v);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else if constexpr (std::is_same_v<T, double>) {
    double d;
    std::memcpy(&d, &v, 8);
    return d;
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  struct stat st {};
  MG_CHECK(::stat(path.c_str(), &st) == 0, IOError, "read_idx: cannot open ", path, ": ", std::strerror(errno));
  MG_CHECK(S_ISREG(st.st_mode), IOError, "read_idx: ", path, " is not a regular file");
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  GzFile f(gzopen(path.c_str(), "rb"));
  MG_CHECK(f != nullptr, IOError, "read_idx: cannot open ", path, ": ", std::strerror(errno));
  gzbuffer(f.get(), 1 << 17);

  unsigned char magic[4];
  read_exact(f.get(), path, magic, 4, "header (the 4-byte magic number)");
  const TypeInfo* type = type_of_code(magic[2]);
  MG_CHECK(magic[0] == 0 && magic[1] == 0 && type && magic[3] >= 1 && magic[3] <= 8, IOError, "read_idx: ", path,
           ": bad magic number ", hex32(be32(magic)),
           ": expected 0x0000TTNN with TT an IDX type (08, 09, 0B, 0C, 0D, 0E) and NN the number of dims (1..8); "
           "is this an IDX file?");
  const int ndim = magic[3];
  std::vector<unsigned char> dimbuf(4 * ndim);
  read_exact(f.get(), path, dimbuf.data(), dimbuf.size(), "header (" + std::to_string(ndim) + " dimension sizes)");
  Shape shape(ndim);
  size_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    shape[d] = be32(&dimbuf[4 * d]);
    MG_CHECK(shape[d] < (int64_t{1} << 31), IOError, "read_idx: ", path, ": dimension ", d, " has size ", shape[d],
             ", which is not plausible (corrupt header?)");
    numel *= static_cast<size_t>(shape[d]);
    MG_CHECK(numel < (size_t{1} << 40), IOError, "read_idx: ", path, ": header dims ", shape_str(shape),
             " describe more than 2^40 elements (corrupt header?)");
  }

  const TypeInfo& ti = *type;
  // The header alone says how much data follows; a corrupt or hostile one must not make us
  // allocate it before the bytes are there. A plain file holds exactly what it holds; a gzip
  // stream cannot inflate more than 1032x (deflate's limit), and its data is read into a buffer
  // that grows as bytes arrive, so memory stays within about twice what the file really holds.
  const size_t need = numel * static_cast<size_t>(ti.file_size);
  const size_t header_bytes = 4 + dimbuf.size();
  const std::string what = "data (header dims " + shape_str(shape) + ", " + std::to_string(numel) + " elements)";
  if (gzdirect(f.get()) == 1) {
    const size_t have = file_bytes - std::min(file_bytes, header_bytes);
    MG_CHECK(need <= have, IOError, "read_idx: ", path, ": truncated file: expected ", need, " bytes of ", what,
             ", got ", have, " (the file is ", file_bytes, " bytes)");
  } else {
    const size_t most = file_bytes > SIZE_MAX / kMaxInflate ? SIZE_MAX : file_bytes * kMaxInflate;
    MG_CHECK(need <= most, IOError, "read_idx: ", path, ": truncated file: expected ", need, " bytes of ", what,
             ", but a ", file_bytes, "-byte gzip file inflates to at most ", most, " bytes");
  }
  std::vector<unsigned char> raw = read_growing(f.get(), path, need, what);
  Tensor out = empty(shape, {ti.dtype, Device::cpu()});
  if (ti.dtype == DType::u8) {
    if (numel) std::memcpy(out.raw_data(), raw.data(), numel);
  } else {
    const int fs = ti.file_size;
    const bool is_signed_byte = magic[2] == 0x09, is_short = magic[2] == 0x0B;
    if (ti.dtype == DType::i32) {
      int32_t* p = out.data_ptr<int32_t>();
      for (size_t i = 0; i < numel; ++i) {
        uint32_t u = load_be<uint32_t>(&raw[i * fs], fs);
        p[i] = is_signed_byte ? static_cast<int8_t>(u) : is_short ? static_cast<int16_t>(u) : static_cast<int32_t>(u);
      }
    } else if (ti.dtype == DType::f32) {
      float* p = out.data_ptr<float>();
      for (size_t i = 0; i < numel; ++i) p[i] = load_be<float>(&raw[i * fs], fs);
    } else {
      double* p = out.data_ptr<double>();
      for (size_t i = 0; i < numel; ++i) p[i] = load_be<double>(&raw[i * fs], fs);
    }
  }
  return out;
}

void write_idx(const std::string& path, const Tensor& t) {
  MG_CHECK(t.defined() && !t.is_cuda(), ValueError, "write_idx: expected a defined CPU tensor");
  MG_CHECK(t.dim() >= 1 && t.dim() <= 8, ValueError, "write_idx: IDX holds 1 to 8 dims, got ", t.dim());
  const TypeInfo* type = type_for_dtype(t.dtype());
  MG_CHECK(type, DTypeError, "write_idx: unsupported dtype ", t.dtype(), " (u8, i32, f32, f64)");
  const int fs = type->file_size;
  std::vector<unsigned char> bytes = {0, 0, type->code, static_cast<unsigned char>(t.dim())};
  auto put_be = [&](uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
  };
  for (int64_t s : t.sizes()) put_be(static_cast<uint64_t>(s), 4);
  Tensor c = raw::contiguous(t);
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  for (int64_t i = 0; i < c.numel(); ++i) {
    uint64_t v = 0;
    std::memcpy(&v, p + i * fs, fs);  // little-endian host: the low fs bytes
    put_be(v, fs);
  }
  GzFile f(gzopen(path.c_str(), ends_with(path, ".gz") ? "wb" : "wbT"));
  MG_CHECK(f != nullptr, IOError, "write_idx: cannot open ", path, " for writing: ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes.size() - done, 1u << 30));
    const int w = gzwrite(f.get(), bytes.data() + done, chunk);
    MG_CHECK(w > 0, IOError, "write_idx: write to ", path, " failed");
    done += static_cast<size_t>(w);
  }
  MG_CHECK(gzclose(f.release()) == Z_OK, IOError, "write_idx: closing ", path, " failed");
}

}  // namespace mg::data
