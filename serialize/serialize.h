// Checkpoint files: a StateDict saved as safetensors (what PyTorch's safetensors reads), written
// atomically, and a loader that turns any damaged or mismatched file into an mg::IOError.
#pragma once

#include <cstddef>
#include <string>

#include "core/atomic_file.h"
#include "core/state_dict.h"
#include "core/tensor.h"

// The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
// "__metadata__": {string: string}}, then the tensor bytes, offsets relative to their start.
// Dtypes: F64 F32 F16 BF16 I64 I32 U8 BOOL. StateDict::meta travels as one JSON string under
// __metadata__["memgrad.meta"]; "format": "pt" is set as safetensors.torch.save_file does.
namespace mg::serialize {

// Writes `dict` to `path` atomically (see write_file_atomically): after a failure the previous
// file, if any, is untouched. CUDA and non-contiguous tensors are copied to the host one at a
// time. Undefined tensors, the name "__metadata__" and non-UTF-8 names are a ValueError.
void save(const StateDict& dict, const std::string& path);
// Reads `path`; tensors are created on `device`. Everything is checked before it is used (sizes,
// JSON, dtypes, shapes, offsets in range and tiling the data exactly, duplicate keys, BOOL bytes):
// a problem is an mg::IOError naming the file and the key.
StateDict load(const std::string& path, Device device = Device::cpu());

// The same, in memory (`source` names the buffer in error messages).
std::string save_to_bytes(const StateDict& dict);
StateDict load_from_bytes(const std::string& bytes, Device device = Device::cpu(),
                          const std::string& source = "<memory>");

// Atomic replacement of a file (mkstemp, fchmod 0644, fsync, rename, directory fsync); lives in
// core/atomic_file.h, named here too for the checkpoint writers.
using mg::ByteSink;
using mg::write_file_atomically;

// safetensors' dtype string for `t` ("F32", ...); mg::DTypeError for a dtype it cannot hold.
const char* safetensors_dtype(DType t);

}  // namespace mg::serialize
