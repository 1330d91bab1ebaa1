#include "nn/models/gpt_pretrained.h"

#include <regex>
#include <set>

#include "autograd/grad_mode.h"
#include "serialize/serialize.h"

namespace mg::nn {

namespace {
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "transformer.h.0.attn.c_attn.weight" -> "h.0.attn.c_attn.weight".
std::string strip_prefix(const std::string& name) {
  return starts_with(name, "transformer.") ? name.substr(std::string("transformer.").size()) : name;
}

// Conv1D weights ([in, out] in the file; nn::Linear keeps [out, in]).
bool is_conv1d_weight(const std::string& hf_name) {
  return ends_with(hf_name, ".c_attn.weight") || ends_with(hf_name, ".c_proj.weight") ||
         ends_with(hf_name, ".c_fc.weight");
}

// The causal-mask buffers of older GPT-2 checkpoints: constants, not weights.
bool is_mask_buffer(const std::string& hf_name) {
  static const std::regex mask(R"(h\.\d+\.attn\.(masked_)?bias)");
  return std::regex_match(hf_name, mask);
}

const Tensor* find(const StateDict& hf, const std::string& name) {
  for (const std::string& n : {name, "transformer." + name}) {
    auto it = hf.tensors.find(n);
    if (it != hf.tensors.end()) return &it->second;
  }
  return nullptr;
}
}  // namespace

GPTConfig hf_gpt2_config(const StateDict& hf, int64_t n_head) {
  const Tensor* wte = find(hf, "wte.weight");
  const Tensor* wpe = find(hf, "wpe.weight");
  MG_CHECK(wte && wpe && wte->dim() == 2 && wpe->dim() == 2, ValueError,
           "hf_gpt2_config: expected wte.weight [vocab, n_embd] and wpe.weight [block_size, n_embd] (a Hugging Face "
           "GPT-2 file), ",
           wte ? "" : "wte.weight missing ", wpe ? "" : "wpe.weight missing");
  GPTConfig c;
  c.vocab_size = wte->size(0);
  c.n_embd = wte->size(1);
  c.block_size = wpe->size(0);
  c.n_head = n_head > 0 ? n_head : std::max<int64_t>(1, c.n_embd / 64);
  c.n_layer = 0;
  static const std::regex layer(R"(h\.(\d+)\..*)");
  std::smatch m;
  for (const auto& [name, t] : hf.tensors) {
    const std::string n = strip_prefix(name);
    if (std::regex_match(n, m, layer)) c.n_layer = std::max<int64_t>(c.n_layer, std::stoll(m[1]) + 1);
  }
  c.dropout = 0.0;
  c.bias = true;
  c.tied_head = true;
  return c;
}

void load_hf_gpt2(GPT& model, const StateDict& hf) {
  MG_CHECK(model.config.tied_head && model.config.bias, ValueError,
           "load_hf_gpt2: GPT-2 has a tied lm head and biases; the model was built without them");
  const StateDict ours = model.state_dict();  // transformer.<hf name> -> tensor, lm_head tied away
  StateDict mapped;
  std::set<std::string> used;
  for (const auto& [name, param] : ours.tensors) {
    MG_CHECK(starts_with(name, "transformer."), ValueError, "load_hf_gpt2: unexpected model tensor ", name);
    const std::string hf_name = name.substr(std::string("transformer.").size());
    const Tensor* src = find(hf, hf_name);
    MG_CHECK(src, ValueError, "load_hf_gpt2: the file has no ", hf_name, " (for the model's ", name, " ",
             shape_str(param.sizes()), ")");
    Tensor t = is_conv1d_weight(hf_name) && src->dim() == 2 ? src->t() : *src;
    MG_CHECK(t.sizes() == param.sizes(), ValueError, "load_hf_gpt2: ", hf_name, " is ", shape_str(src->sizes()),
             " in the file but the model's ", name, " needs ",
             shape_str(is_conv1d_weight(hf_name) ? Shape{param.size(1), param.size(0)} : param.sizes()),
             is_conv1d_weight(hf_name) ? " (Conv1D: [in, out])" : "");
    mapped.tensors[name] = t.dtype() == param.dtype() ? t : t.to(param.dtype());
    used.insert(hf_name);
  }
  for (const auto& [name, t] : hf.tensors) {
    const std::string n = strip_prefix(name);
    if (used.count(n) || is_mask_buffer(n)) continue;
    if (n == "lm_head.weight") {  // the tied head: must be wte itself
      MG_CHECK(t.sizes() == model.wte->weight.sizes(), ValueError, "load_hf_gpt2: lm_head.weight is ",
               shape_str(t.sizes()), " but wte is ", shape_str(model.wte->weight.sizes()), " (GPT-2 ties them)");
      continue;
    }
    throw ValueError("load_hf_gpt2: the file's tensor " + name + " " + shape_str(t.sizes()) +
                     " has no place in a GPT-2 of " + std::to_string(model.config.n_layer) + " layers");
  }
  model.load_state_dict(mapped, /*strict=*/true);
}

std::shared_ptr<GPT> gpt2_from_hf_safetensors(const std::string& path, TensorOptions opts, int64_t n_head) {
  const StateDict hf = serialize::load(path, Device::cpu());
  auto model = std::make_shared<GPT>(hf_gpt2_config(hf, n_head), opts, nullptr, /*init_weights=*/false);
  load_hf_gpt2(*model, hf);
  return model;
}

StateDict hf_gpt2_state_dict(const GPT& model) {
  StateDict hf;
  for (const auto& [name, t] : model.state_dict().tensors) {
    const std::string n = strip_prefix(name);
    hf.tensors[n] = is_conv1d_weight(n) ? t.t().contiguous() : t;
  }
  return hf;
}

}  // namespace mg::nn
