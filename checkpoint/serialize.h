// Checkpoint files: a StateDict saved as safetensors (what PyTorch's safetensors reads), written
// atomically, and a loader that turns any damaged or mismatched file into an mg::IOError.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "core/state_dict.h"
#include "core/tensor.h"

// The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
// "__metadata__": {string: string}}, then the tensor bytes, offsets relative to their start.
// Dtypes: F64 F32 F16 BF16 I64 I32 U8 BOOL. StateDict::meta travels as one JSON string under
// __metadata__["memgrad.meta"]; "format": "pt" is set as safetensors.torch.save_file does.
namespace mg::nn {

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

// Replaces `path` atomically: `produce` writes the contents through the sink it is given into a
// temporary file in the same directory, which is fsynced, renamed over `path`, and the directory
// fsynced (so the rename itself survives a crash). If `produce` throws or any step fails, the
// temporary file is removed, `path` is left as it was, and the error propagates (system
// failures as mg::IOError naming the path and the reason).
using ByteSink = std::function<void(const void* data, size_t n)>;
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink& sink)>& produce);

// safetensors' dtype string for `t` ("F32", ...); mg::DTypeError for a dtype it cannot hold.
const char* safetensors_dtype(DType t);

}  // namespace mg::nn
