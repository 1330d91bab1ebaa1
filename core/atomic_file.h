// Replacing a file atomically: the bytes go to a mkstemp temporary file in the target's
// directory, which gets mode 0644, is fsynced, renamed over the target, and the directory is
// fsynced. Used by checkpoint files (serialize/serialize) and record files (data/mmap_dataset).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>

namespace mg {

// A file descriptor closed on scope exit; close it explicitly (release() then ::close) where the
// result matters.
struct UniqueFd {
  int fd = -1;
  UniqueFd() = default;
  explicit UniqueFd(int f) : fd(f) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

// The mode every file written through write_file_atomically gets: rw-r--r--. Set with fchmod on
// the temporary file (mkstemp makes it 0600); the process umask is never read or changed, so
// other threads creating files meanwhile are not affected.
constexpr mode_t kAtomicFileMode = 0644;

// Replaces `path` atomically: `produce` writes the contents through the sink it is given into a
// temporary file `path.tmp.XXXXXX` in the same directory, which is fchmod-ed to kAtomicFileMode,
// fsynced, renamed over `path`, and the directory fsynced (so the rename itself survives a
// crash). If `produce` throws or any step fails, the temporary file is removed, `path` is left
// as it was, and the error propagates (system failures as mg::IOError naming the path and the
// reason).
using ByteSink = std::function<void(const void* data, size_t n)>;
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink& sink)>& produce);

}  // namespace mg
