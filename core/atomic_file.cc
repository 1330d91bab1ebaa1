#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mg {

namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return "write_file_atomically(" + path + "): " + what + " failed: " + std::strerror(errno);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) MG_THROW(IOError, sys_error("write", path));
    p += put;
    n -= static_cast<size_t>(put);
  }
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd >= 0) ::close(fd);
}

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink& sink)>& produce) {
  MG_CHECK(!path.empty(), ValueError, "write_file_atomically: empty path");
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string tmp = path + ".tmp.XXXXXX";
  UniqueFd f(::mkostemp(tmp.data(), O_CLOEXEC));
  if (f.fd < 0) MG_THROW(IOError, sys_error("creating a temporary file in " + dir, path));
  try {
    produce([&](const void* data, size_t n) { write_all(f.fd, data, n, path); });
    if (::fchmod(f.fd, kAtomicFileMode) != 0) MG_THROW(IOError, sys_error("fchmod", path));
    if (::fsync(f.fd) != 0) MG_THROW(IOError, sys_error("fsync", path));
    if (::close(f.release()) != 0) MG_THROW(IOError, sys_error("close", path));
    if (::rename(tmp.c_str(), path.c_str()) != 0) MG_THROW(IOError, sys_error("rename", path));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0 || ::fsync(d.fd) != 0) MG_THROW(IOError, sys_error("fsync of directory " + dir, path));
}

}  // namespace mg
