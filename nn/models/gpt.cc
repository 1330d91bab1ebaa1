#include "nn/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <unordered_set>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/random.h"
#include "kernels/deferred_checks.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
const GPTConfig& checked(const GPTConfig& c) {
  MG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer >= 0 && c.n_head > 0 && c.n_embd > 0, ValueError,
           "GPT: vocab_size, block_size, n_head and n_embd must be positive and n_layer >= 0");
  MG_CHECK(c.n_embd % c.n_head == 0, ValueError, "GPT: n_embd (", c.n_embd, ") must be a multiple of n_head (",
           c.n_head, ")");
  return c;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

GPT::GPT(const GPTConfig& cfg, TensorOptions opts, Generator* gen, bool init_weights)
    : Module("GPT"), config(checked(cfg)) {
  const GPTConfig& c = config;
  transformer = register_module("transformer", std::make_shared<Module>("Transformer"));
  wte = transformer->register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd, opts, gen));
  wpe = transformer->register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd, opts, gen));
  drop = transformer->register_module("drop", std::make_shared<Dropout>(c.dropout));
  TransformerBlockOptions bo;
  bo.n_embd = c.n_embd;
  bo.n_head = c.n_head;
  bo.causal = true;
  bo.dropout = c.dropout;
  bo.bias = c.bias;
  bo.gelu_approximate = "tanh";
  h = transformer->register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<TransformerBlock>(bo, opts, gen));
  ln_f = transformer->register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd, 1e-5, true, c.bias, opts));
  lm_head = register_module("lm_head", std::make_shared<Linear>(c.n_embd, c.vocab_size, false, opts, gen));
  // Weight tying: the head's slot now holds wte's tensor, so both modules own one Parameter
  // (parameters() lists it once, under its first name transformer.wte.weight). Its gradient
  // is the sum of the embedding's and the head's contributions.
  if (c.tied_head) lm_head->weight = wte->weight;
  if (!init_weights) return;
  // GPT-2 init (nanoGPT's _init_weights plus the scaled residual projections).
  const double std_proj = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer > 0 ? c.n_layer : 1));
  for (auto& [name, p] : named_parameters()) {
    if (ends_with(name, "wte.weight") || ends_with(name, "wpe.weight")) {
      // Embedding drew N(0, 1) already: scaling gives N(0, 0.02^2) without drawing again.
      NoGradGuard ng;
      mul_(p, 0.02);
    } else if (ends_with(name, "c_proj.weight")) {
      init::normal_(p, 0.0, std_proj, gen);
    } else if (p.dim() == 2) {  // Linear and Embedding weights
      init::normal_(p, 0.0, 0.02, gen);
    } else if (ends_with(name, ".bias")) {
      init::zeros_(p);
    }
  }
}

Tensor GPT::embed(const Tensor& idx, int64_t start) {
  MG_CHECK(idx.defined() && idx.dim() == 2, ShapeError, "GPT: idx must be token ids [B, T], got ",
           idx.defined() ? shape_str(idx.sizes()) : std::string("(undefined)"));
  const int64_t T = idx.size(1);
  MG_CHECK(start + T <= config.block_size, ValueError, "GPT: sequence length ", start + T, " exceeds block_size ",
           config.block_size);
  // Positions start .. start + T: rows of wpe taken as a view (the whole table at full length), the
  // rows an embedding lookup of arange(start, start + T) returns, with the same gradient, but no
  // lookup: no gather, and no index check, whose host read would stall every step's start.
  const Tensor& table = wpe->weight;
  const Tensor pos = start == 0 && T == table.size(0) ? table : table.slice(0, start, start + T);
  return (*drop)(add((*wte)(idx), pos));  // [B, T, C] + [T, C]
}

Tensor GPT::forward(const Tensor& idx) { return (*lm_head)(hidden(idx)); }

Tensor GPT::forward_loss(const Tensor& idx, const Tensor& targets, int64_t ignore_index) {
  MG_CHECK(idx.defined() && targets.defined() && idx.dim() == 2 && targets.sizes() == idx.sizes(), ShapeError,
           "GPT::forward_loss: expected idx and targets [B, T] of one shape, got ",
           idx.defined() ? shape_str(idx.sizes()) : std::string("(undefined)"), " and ",
           targets.defined() ? shape_str(targets.sizes()) : std::string("(undefined)"));
  // The token ids' bounds check and the loss's label checks (one a head chunk) are read once,
  // after the loss, not each on its own: the ids' check would hold the host at the step's start
  // until the device had run the previous step's backward and optimizer, and each label check
  // would drain the queue (kernels/deferred_checks.h). A bad id or label still raises here.
  kernels::DeferredIndexChecks checks;
  Tensor x = hidden(idx);
  lm_head->run_forward_pre_hooks();  // what (*lm_head)(x) would run (pruning masks, sharding)
  Tensor loss = linear_cross_entropy(x, lm_head->weight, targets, "mean", ignore_index, 0.0, recompute.head_chunk_rows);
  checks.finish();
  return loss;
}

// The blocks run on a residual stream whose adds fuse into the next layer norm (mg::Residual);
// checkpointing, selective recomputation and offload are the plan's (nn/models/recompute_plan.h).
Tensor GPT::hidden(const Tensor& idx) {
  if (recompute.units != nullptr) recompute.units->enter(0);  // the root: embeddings, ln_f, the head
  BlockPlan plan(recompute, config.n_layer);
  Residual x = embed(idx, 0);
  for (int64_t i = 0; i < config.n_layer; ++i) x = plan.run(i, block(i), x);
  plan.finish();
  return (*ln_f)(x);
}

Tensor GPT::forward_cached(const Tensor& idx, KVCache& cache) {
  NoGradGuard no_grad;
  MG_CHECK(cache.k.size() == static_cast<size_t>(config.n_layer) && cache.capacity <= config.block_size, ValueError,
           "GPT::forward_cached: the cache (", cache.k.size(), " layers, capacity ", cache.capacity,
           ") was not made for this model (", config.n_layer, " layers, block_size ", config.block_size, ")");
  if (cache.length > 0 && idx.dim() == 2 && idx.size(1) > 1) {  // one position at a time
    std::vector<Tensor> out;
    for (int64_t t = 0; t < idx.size(1); ++t) out.push_back(forward_cached(idx.narrow(1, t, 1), cache));
    return cat(out, 1);
  }
  Tensor x = embed(idx, cache.length);
  const auto blocks = h->children();
  for (size_t i = 0; i < blocks.size(); ++i) x = static_cast<TransformerBlock&>(*blocks[i]).forward_cached(x, cache, i);
  cache.length += idx.size(1);
  return (*lm_head)((*ln_f)(x));
}

Tensor GPT::loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  MG_CHECK(logits.defined() && targets.defined() && logits.dim() == 3 && targets.dim() == 2 &&
               logits.size(0) == targets.size(0) && logits.size(1) == targets.size(1),
           ShapeError, "GPT::loss: expected logits [B, T, V] and targets [B, T], got ",
           logits.defined() ? shape_str(logits.sizes()) : std::string("(undefined)"), " and ",
           targets.defined() ? shape_str(targets.sizes()) : std::string("(undefined)"));
  return cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}), "mean", ignore_index);
}

namespace {
// Index of a token drawn from softmax(logits / temperature) restricted to the top_k largest.
int64_t sample_token(std::vector<float> logits, const GenerateOptions& o, Generator* gen) {
  const auto n = static_cast<int64_t>(logits.size());
  if (o.temperature <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (o.top_k > 0 && o.top_k < n) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[o.top_k - 1];
    for (float& l : logits)
      if (l < kth) l = -std::numeric_limits<float>::infinity();
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp((logits[i] - top) / o.temperature);
  double u = rand({1}, {DType::f64}, gen).item() * total;
  for (int64_t i = 0; i < n; ++i)
    if ((u -= p[i]) < 0) return i;
  return n - 1;  // u landed on the rounding slack at the very end
}
}  // namespace

std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
                              Generator* gen) {
  MG_CHECK(!prompt.empty(), ValueError, "generate: the prompt must hold at least one token");
  MG_CHECK(o.max_new_tokens >= 0, ValueError, "generate: max_new_tokens must be >= 0, got ", o.max_new_tokens);
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  const Device dev = model.wte->weight.device();
  const int64_t block = model.config.block_size;
  KVCache cache = model.make_cache();
  std::vector<int64_t> seq = prompt, out;
  auto feed = [&](std::vector<int64_t> ids) {  // -> logits of the last position, on the host
    Tensor idx = from_vector(ids, {1, static_cast<int64_t>(ids.size())}).to(dev);
    Tensor logits = model.forward_cached(idx, cache);
    return logits.select(1, logits.size(1) - 1).reshape({-1}).to(DType::f32).cpu().to_vector<float>();
  };
  auto window = [&](int64_t keep) {
    cache.clear();
    return feed(std::vector<int64_t>(seq.end() - std::min<int64_t>(keep, seq.size()), seq.end()));
  };
  std::vector<float> logits = window(block);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t next = sample_token(std::move(logits), o, gen);
    seq.push_back(next);
    out.push_back(next);
    if (i + 1 == o.max_new_tokens) break;
    logits = cache.length < block ? feed({next}) : window(std::max<int64_t>(1, block / 2));
  }
  if (was_training) model.train();
  return out;
}

namespace {
struct NamedShape {
  const char* name;
  int64_t n_layer, n_embd, n_head;
};
constexpr NamedShape kPresets[] = {{"gpt2", 12, 768, 12},        {"gpt2-medium", 24, 1024, 16},
                                   {"gpt2-large", 36, 1280, 20}, {"gpt2-xl", 48, 1600, 25},
                                   {"gpt-2.7b", 32, 2560, 32},   {"gpt-6.7b", 32, 4096, 32}};
}  // namespace

std::vector<std::string> gpt_preset_names() {
  std::vector<std::string> names;
  for (const NamedShape& p : kPresets) names.emplace_back(p.name);
  return names;
}

GPTConfig gpt_preset(const std::string& name) {
  for (const NamedShape& p : kPresets)
    if (name == p.name) {
      GPTConfig c;
      c.n_layer = p.n_layer, c.n_embd = p.n_embd, c.n_head = p.n_head;
      return c;
    }
  std::string valid;
  for (const NamedShape& p : kPresets) valid += std::string(valid.empty() ? "" : ", ") + p.name;
  MG_THROW(ValueError, "gpt_preset: unknown model \"", name, "\" (valid: ", valid, ")");
}

int64_t gpt_num_params(const GPTConfig& c) {
  const int64_t d = c.n_embd, b = c.bias ? 1 : 0;
  // Per block: two layer norms (weight, bias), qkv (3d^2 + 3d), the attention's projection
  // (d^2 + d) and the MLP (4d^2 + 4d and 4d^2 + d).
  const int64_t block = 12 * d * d + (2 + 2 * b) * d + b * (3 * d + d + 4 * d + d);
  const int64_t head = c.tied_head ? 0 : c.vocab_size * d;
  return c.vocab_size * d + c.block_size * d + c.n_layer * block + (1 + b) * d + head;
}

std::vector<std::vector<Tensor>> gpt_param_units(GPT& model) {
  std::vector<std::vector<Tensor>> units(1 + static_cast<size_t>(model.config.n_layer));
  std::unordered_set<const TensorImpl*> in_blocks;
  for (int64_t i = 0; i < model.config.n_layer; ++i)
    for (const Tensor& p : model.block(i).parameters()) {
      units[static_cast<size_t>(i) + 1].push_back(p);
      in_blocks.insert(p.impl());
    }
  for (const Tensor& p : model.parameters())
    if (!in_blocks.count(p.impl())) units[0].push_back(p);
  return units;
}

std::vector<Tensor> gpt_linear_params(GPT& model, int64_t first_block) {
  MG_CHECK(first_block >= 0 && first_block <= model.config.n_layer, ValueError,
           "gpt_linear_params: first_block must be in [0, ", model.config.n_layer, "], got ", first_block);
  std::vector<Tensor> out;
  for (int64_t b = first_block; b < model.config.n_layer; ++b)
    for (const auto& [name, m] : model.block(b).named_modules())
      if (auto* lin = dynamic_cast<Linear*>(m)) {
        out.push_back(lin->weight);
        if (lin->bias.defined()) out.push_back(lin->bias);
      }
  return out;
}

std::function<DType(const Tensor&)> gpt_unit_dtype(GPT& model, DType compute) {
  auto linear = std::make_shared<std::unordered_set<const TensorImpl*>>();
  for (const Tensor& p : gpt_linear_params(model)) linear->insert(p.impl());
  return [linear, compute](const Tensor& p) { return linear->count(p.impl()) ? compute : p.dtype(); };
}

double gpt_flops_per_token(const GPTConfig& cfg, int64_t T) {
  return 6.0 * static_cast<double>(gpt_num_params(cfg)) +
         6.0 * static_cast<double>(cfg.n_layer) * static_cast<double>(cfg.n_embd) * static_cast<double>(T);
}

double dense_half_peak_flops(const std::string& device_name) {
  return device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos ? 989e12 : 0.0;
}

double gpt_mfu(const GPTConfig& cfg, int64_t T, double tokens_per_s, double peak_flops) {
  MG_CHECK(peak_flops > 0, ValueError, "gpt_mfu: the peak must be > 0 FLOP/s, got ", peak_flops);
  return tokens_per_s * gpt_flops_per_token(cfg, T) / peak_flops;
}

}  // namespace mg::nn
