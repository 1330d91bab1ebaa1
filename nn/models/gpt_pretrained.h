// Pretrained GPT-2 weights: the Hugging Face safetensors layout (what GPT2LMHeadModel's
// model.safetensors holds) mapped onto nn::GPT's modules, and that layout written back out.
#pragma once

#include <memory>
#include <string>

#include "core/state_dict.h"
#include "nn/models/gpt.h"

// The layout: wte.weight [V, C], wpe.weight [T, C], h.N.ln_1.{weight,bias},
// h.N.attn.c_attn.{weight [C, 3C], bias}, h.N.attn.c_proj.{weight [C, C], bias}, h.N.ln_2.*,
// h.N.mlp.c_fc.{weight [C, 4C], bias}, h.N.mlp.c_proj.{weight [4C, C], bias}, ln_f.*; names may
// carry a "transformer." prefix; lm_head.weight, when present, equals wte (tied). The projections
// are GPT-2's Conv1D, which stores its weight [in, out]: the transpose of nn::Linear's [out, in].
// The attention-mask buffers (h.N.attn.bias, h.N.attn.masked_bias) of older files are skipped.
namespace mg::nn {

// The config those tensors describe: vocab_size and n_embd from wte, block_size from wpe,
// n_layer from the h.N indices; n_head is not stored, so n_head > 0 is taken as given and 0
// means n_embd / 64 (every released GPT-2 size has 64-wide heads). ValueError when wte or wpe
// is missing.
GPTConfig hf_gpt2_config(const StateDict& hf, int64_t n_head = 0);

// Copies the Hugging Face tensors into `model` (each onto the parameter's dtype and device).
// Everything is checked first: a name the layout lacks, a missing tensor or a wrong shape is a
// ValueError naming the tensor and the shapes, and the model is left unchanged.
void load_hf_gpt2(GPT& model, const StateDict& hf);

// Reads a safetensors file in that layout and builds the GPT it holds (tied head, biases,
// dropout 0) on opts' device with opts' dtype.
std::shared_ptr<GPT> gpt2_from_hf_safetensors(const std::string& path, TensorOptions opts = {}, int64_t n_head = 0);

// The model's parameters in that layout (Conv1D weights transposed back, no prefix, no
// lm_head): what load_hf_gpt2 reads, for writing a file PyTorch's GPT-2 code loads.
StateDict hf_gpt2_state_dict(const GPT& model);

}  // namespace mg::nn
