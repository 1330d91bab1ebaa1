// Reader for the IDX format (MNIST, Fashion-MNIST): a big-endian header (magic 0x0000TTNN,
// then NN dims) and the raw elements. Gzipped files are read through zlib transparently.
#pragma once

#include <string>

#include "core/tensor.h"

namespace mg::data {

// Reads an IDX file (plain or .gz) into a CPU tensor whose shape is the file's dims.
// Element types: 0x08 -> u8, 0x09 (i8) -> i32, 0x0B (i16) -> i32, 0x0C -> i32, 0x0D -> f32,
// 0x0E -> f64. A missing, truncated or corrupt file, a bad magic number or an unknown
// type raises mg::IOError naming the file and what was expected. Allocated under the
// current MemoryCategoryGuard (use MemoryCategory::Data).
Tensor read_idx(const std::string& path);

// Writes a tensor (u8, i32, f32 or f64, CPU) as IDX; gzipped when `path` ends in ".gz".
// Used by tests and by tools that cut down data sets.
void write_idx(const std::string& path, const Tensor& t);

}  // namespace mg::data
