#include "examples/gpt2_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>

#include "core/error.h"
#include "nn/models/gpt.h"

namespace mg::examples {

const char* kGPT2Usage = R"(usage: gpt2 [flags]

Trains a GPT on a text file, prints the training and validation loss, samples text through a
key-value cache, and ends with one JSON line (validation loss, tokens/s, peak memory by category).

Model and data:
  --preset NAME        tiny (default: 2 layers, 64 wide, T=64; a CPU run of about a minute),
                       small (6 layers, 384 wide, T=256), gpt2 (124M: 12 layers, 768 wide,
                       12 heads, T=1024, vocab 50304), or a larger GPT at gpt2's batch and
                       context: gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.56B),
                       gpt-2.7b, gpt-6.7b
  --n-layer N, --n-embd N, --n-head N, --block-size T, --dropout P, --vocab-size V
                       override the preset's shape (V >= the tokenizer's vocabulary)
  --batch N            sequences per optimizer step; --steps N; --lr X (and the optimizer
                       flags below; default AdamW, cosine schedule)
  --data FILE          training text (default: the project's docs and sources, built in)
  --val-fraction F     the last F of the tokens are the validation split (default 0.1)
  --bpe-encoder FILE --bpe-vocab FILE
                       GPT-2's tokenizer (encoder.json, vocab.bpe); default: bytes (vocab 256)
  --init-from FILE     start from Hugging Face GPT-2 weights (model.safetensors layout); the
                       shape comes from the file (--n-head: default n_embd / 64)
  --print-logits       with --init-from: print the logits of --tokens A,B,... (default GPT-2's
                       ids of "Hello, I'm a language model.") and exit; --logits-out FILE also
                       saves them all as safetensors (bench/pytorch/gpt2_logits.py compares)
Evaluation and sampling:
  --eval-every N       validate every N steps (and at the end); --eval-iters N batches each
  --sample-every N     print a sample every N steps (0: only at the end); --max-new-tokens N,
                       --temperature X (0: greedy), --top-k K (0: all), --prompt TEXT
Memory and speed:
  --amp MODE           off (default), bf16 (autocast) or f16 (autocast + GradScaler; CUDA)
  --fp8                with --amp: the linear layers' GEMMs in FP8 (e4m3 weights and activations,
                       e5m2 gradients, per-tensor current scaling; mg::Fp8Autocast), those whose
                       in and out features are at least --fp8-min-features N (default 1280,
                       where FP8 paid on an H100: GPT-2 124M and medium keep bf16; 0: every one)
  --fp8-delayed        with --fp8: delayed scaling (each cast's scale from the largest amax of the
                       operand's previous 16 casts: one pass over each operand instead of two;
                       --save keeps the histories and --resume restores them)
  --fp8-fast-accum     with --fp8: the gradients' GEMMs accumulate fast too, as the forward's do
                       (no periodic f32 promotion of their partial sums; Fp8Accumulation::Fast)
  --recompute MODE     none (default), per-block (checkpoint every block), per-block-keep (every
                       block checkpointed keeping its attention and MLP outputs and weight casts:
                       about half the replay), selective (rebuild norms, GELU, dropout),
                       per-block+selective, or planner:BUDGET (the
                       planner checkpoints the fewest blocks whose activations fit BUDGET:
                       "60%" of no recomputation's, or bytes such as 512MiB, 2GiB)
  --memory-budget SIZE before training, the fastest recomputation whose whole training step
                       (weights, gradients, optimizer state, casts, activations) peaks under SIZE
                       (bytes such as 3.5GiB, 512MiB): one trial step per configuration, from no
                       recomputation through GELU-only selective to 1 .. n_layer blocks
                       checkpointed; with adam/adamw, when none fits, the same rungs again
                       with 8-bit moments (--optimizer adamw8bit, said when chosen), then where
                       --offload is allowed (below) with optimizer and then parameter offload; a
                       clear error naming the smallest peak when none fits. Replaces --recompute
                       and --offload; one rank only
  --offload WHERE      where the model state lives (one CUDA device, --amp bf16, no clipping:
                       the update runs inside backward, before the global gradient norm exists;
                       so --clip-grad-norm 0, and --grad-accum 1): none (default); optimizer (the
                       blocks' Linear parameters' f32 masters and AdamW moments in pinned host
                       memory, each updated on the host as backward finishes its gradient: 2
                       bytes a parameter on the device); params (every parameter in host memory,
                       a block's bf16 weights on the device only while it runs, fetched
                       --offload-prefetch N blocks ahead, default 1; the model is built in host
                       memory). With --memory-budget and these conditions met, the budget tries
                       them after the f32 and 8-bit moments
  --offload-optimizer-blocks N  with --offload optimizer: only the last N blocks' Linear
                       parameters go to the host (their updates hide behind backward; the others
                       stay on the device); default every block. N = auto: the most blocks whose
                       step, timed before training at learning rate 0, stays within
                       --offload-optimizer-ratio R (default 1.3) of the step with every block on
                       the device
  --offload-blocks N   what the first N blocks save for backward goes to pinned host memory
                       during the forward and comes back ahead of backward (CUDA; on the H200
                       one GPT-2 block at B=8 costs under 1 %); with --memory-budget the
                       checkpointed blocks are the ones after them. N = auto: the most blocks
                       whose copies hide behind the forward and backward (within 5 % of the
                       blocks' time), from the host link's measured bandwidth and the blocks'
                       profiled bytes and times, stopping before a block larger than the
                       512 MiB prefetch window (0 off CUDA)
  --grad-accum N       split each step's batch into N micro-batches (same gradient)
  --auto-batch         the largest micro-batch that fits (find_max_batch_size: doubling then
                       bisection over out-of-memory errors, at most --max-batch N, default
                       1024); the step's batch becomes it times --grad-accum
  --nproc N            N processes (one GPU each, DistributedDataParallel; on the CPU the CPU
                       backend); or start the ranks yourself with tools/launch --nproc N -- gpt2
  --zero               with several ranks: shard the optimizer state (ZeRO-1)
  --zero-stage N       1 (the default of --zero) or 2: the gradients sharded too, reduce-scattered
                       during backward instead of DDP's all-reduce; 3: the parameters too, a block
                       gathered while it runs (dist::fully_shard; implies --zero)
  --zero-offload       with --zero-stage 3: the shards, their gradients and the optimizer state in
                       (pinned) host memory, the update on the host (FSDP2's CPUOffloadPolicy)
  --save PATH          write a training checkpoint at every validation and at the end (atomic);
                       under --zero-stage 3 it holds the state gathered from the shards (it
                       resumes at any --nproc); not with --zero-stage 1 or 2
  --trace PATH         record the third training step (after two warm-up steps) as a Chrome trace
                       (op, backward-node and phase ranges, memory counters) to open in Perfetto
  --resume PATH        continue from it with the same flags; --stop-after N ends after step N
Other:
  --seed N (default 0), --device cpu|cuda|cuda:N, --no-progress, --help

Optimizer, schedule and clipping (steps of the schedule are optimizer steps):
)";

namespace {

struct Preset {
  int64_t n_layer, n_embd, n_head, block_size, vocab_size, batch, steps, eval_every, eval_iters, sample_every,
      max_new_tokens;
  double lr;
};

// tiny: learns the corpus's byte statistics in ~1 min on 2 CPU cores (tests/examples:gpt2_test).
// small: nanoGPT's character-level Shakespeare model. gpt2: GPT-2 124M as bench_models runs it.
const std::map<std::string, Preset> kPresets = {
    {"tiny", {2, 64, 4, 64, 0, 16, 300, 100, 8, 0, 120, 3e-3}},
    {"small", {6, 384, 6, 256, 0, 32, 3000, 250, 20, 1000, 300, 1e-3}},
    {"gpt2", {12, 768, 12, 1024, 50304, 8, 100, 50, 10, 0, 100, 6e-4}},
};

}  // namespace

std::string offload_conflict(const GPT2Flags& f) {
  // The host update of a parameter runs as soon as backward has its gradient: nothing may need
  // every gradient first, and the device keeps only bf16 copies.
  if (f.train.clip_grad_norm > 0)
    return "the update runs inside backward, before the global gradient norm exists: pass --clip-grad-norm 0";
  if (f.amp != "bf16") return "the device computes with bf16 copies of the host's masters: pass --amp bf16";
  if (f.grad_accum != 1) return "each gradient updates its parameter as it comes home: --grad-accum must be 1";
  if (f.nproc > 1 || f.zero) return "one rank only (with several, --zero-stage 3 --zero-offload)";
  if (f.fp8) return "not with --fp8";
  return "";
}

int64_t parse_bytes(const std::string& flag, const std::string& v) {
  static const std::vector<std::pair<std::string, double>> units = {
      {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}};
  for (const auto& [u, scale] : units)
    if (v.size() > u.size() && v.compare(v.size() - u.size(), u.size(), u) == 0)
      return static_cast<int64_t>(parse_number(flag, v.substr(0, v.size() - u.size())) * scale);
  return parse_integer(flag, v);
}

GPT2Flags parse_gpt2_flags(int argc, char** argv) {
  GPT2Flags f;
  f.train.optimizer = "adamw";
  f.train.scheduler = "cosine";
  f.train.weight_decay = 0.1;
  f.train.beta2 = 0.95;
  f.train.clip_grad_norm = 1.0;
  // The preset first, so the other flags override it wherever they stand.
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--preset") f.preset = argv[i + 1];
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--preset=", 0) == 0) f.preset = std::string(argv[i]).substr(9);
  // The larger GPTs: nn::gpt_preset's shapes, trained as the gpt2 preset is (B=8, T=1024), at the
  // lower learning rates GPT-2's and GPT-3's papers used for them.
  Preset ps{};
  if (auto p = kPresets.find(f.preset); p != kPresets.end()) {
    ps = p->second;
  } else {
    const auto names = nn::gpt_preset_names();
    MG_CHECK(std::find(names.begin(), names.end(), f.preset) != names.end(), ValueError, "unknown --preset \"",
             f.preset, "\" (valid: tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt-2.7b, gpt-6.7b)");
    const nn::GPTConfig c = nn::gpt_preset(f.preset);
    ps = kPresets.at("gpt2");
    ps.n_layer = c.n_layer, ps.n_embd = c.n_embd, ps.n_head = c.n_head;
    ps.lr = c.n_embd <= 1024 ? 3e-4 : c.n_embd <= 1600 ? 2e-4 : 1.6e-4;
  }
  f.model.n_layer = ps.n_layer;
  f.model.n_embd = ps.n_embd;
  f.model.n_head = ps.n_head;
  f.model.block_size = ps.block_size;
  f.model.dropout = 0.0;
  f.vocab_size = ps.vocab_size;
  f.batch = ps.batch;
  f.steps = ps.steps;
  f.eval_every = ps.eval_every;
  f.eval_iters = ps.eval_iters;
  f.sample_every = ps.sample_every;
  f.max_new_tokens = ps.max_new_tokens;
  f.train.lr = ps.lr;
  f.train.warmup_steps = -1;  // default below: steps / 20

  const CommandLine command_line = {
      .usage = std::string(kGPT2Usage) + kTrainingUsage,
      .switches = {{"--no-progress", {&f.progress, false}},
                   {"--auto-batch", {&f.auto_batch, true}},
                   {"--zero", {&f.zero, true}},
                   {"--zero-offload", {&f.zero_offload, true}},
                   {"--fp8", {&f.fp8, true}},
                   {"--fp8-delayed", {&f.fp8_delayed, true}},
                   {"--fp8-fast-accum", {&f.fp8_fast_accum, true}},
                   {"--print-logits", {&f.print_logits, true}}},
      .fields =
          {
              {"--preset", &f.preset},
              {"--n-layer", &f.model.n_layer},
              {"--n-embd", &f.model.n_embd},
              {"--block-size", &f.model.block_size},
              {"--dropout", &f.model.dropout},
              {"--vocab-size", &f.vocab_size},
              {"--batch", &f.batch},
              {"--steps", &f.steps},
              {"--data", &f.data},
              {"--trace", &f.trace},
              {"--val-fraction", &f.val_fraction},
              {"--bpe-encoder", &f.bpe_encoder},
              {"--bpe-vocab", &f.bpe_vocab},
              {"--init-from", &f.init_from},
              {"--logits-out", &f.logits_out},
              {"--eval-every", &f.eval_every},
              {"--eval-iters", &f.eval_iters},
              {"--sample-every", &f.sample_every},
              {"--max-new-tokens", &f.max_new_tokens},
              {"--temperature", &f.temperature},
              {"--top-k", &f.top_k},
              {"--prompt", &f.prompt},
              {"--amp", &f.amp},
              {"--recompute", &f.recompute},
              {"--memory-budget", &f.memory_budget},
              {"--grad-accum", &f.grad_accum},
              {"--max-batch", &f.max_batch},
              {"--save", &f.save},
              {"--resume", &f.resume},
              {"--stop-after", &f.stop_after},
              {"--device", &f.device},
              {"--seed", &f.seed},
              {"--nproc", &f.nproc},
              {"--zero-stage", &f.zero_stage},
              {"--fp8-min-features", &f.fp8_min_features},
              {"--offload", &f.offload},
              {"--offload-prefetch", &f.offload_prefetch},
              {"--tokens", &f.logit_tokens},
          },
      .other =
          [&](const std::string& flag, const std::string& value) {
            if (flag == "--n-head") {
              f.model.n_head = parse_integer(flag, value);
              f.n_head_given = true;
            } else if (flag == "--offload-blocks") {
              f.offload_auto = value == "auto";
              if (!f.offload_auto) f.offload_blocks = parse_integer(flag, value);
            } else if (flag == "--offload-optimizer-blocks") {
              f.offload_optimizer_auto = value == "auto";
              if (!f.offload_optimizer_auto) f.offload_optimizer_blocks = parse_integer(flag, value);
            } else if (flag == "--offload-optimizer-ratio") {
              f.offload_optimizer_ratio = parse_number(flag, value);
            } else {
              return false;
            }
            return true;
          },
  };
  parse_command_line(argc, argv, command_line, f.train);
  // The command line less --nproc N (or --nproc=N), for the ranks spawn() starts.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc")
      ++i;
    else if (arg.rfind("--nproc=", 0) != 0)
      f.passthrough.push_back(arg);
  }
  MG_CHECK(f.batch >= 1 && f.steps >= 1 && f.grad_accum >= 1, ValueError,
           "--batch, --steps and --grad-accum must be >= 1");
  MG_CHECK(f.batch % f.grad_accum == 0 || f.auto_batch, ValueError, "--batch (", f.batch,
           ") must be a multiple of --grad-accum (", f.grad_accum, ")");
  MG_CHECK(f.eval_iters >= 1 && f.eval_every >= 0 && f.sample_every >= 0 && f.max_new_tokens >= 0 && f.top_k >= 0,
           ValueError, "--eval-iters must be >= 1; --eval-every, --sample-every, --max-new-tokens, --top-k >= 0");
  MG_CHECK(f.val_fraction > 0 && f.val_fraction < 1, ValueError, "--val-fraction must be in (0, 1), got ",
           f.val_fraction);
  MG_CHECK(f.model.dropout >= 0 && f.model.dropout < 1, ValueError, "--dropout must be in [0, 1)");
  MG_CHECK(f.fp8_min_features >= 0, ValueError, "--fp8-min-features must be >= 0, got ", f.fp8_min_features);
  MG_CHECK(!f.fp8_delayed || f.fp8, ValueError, "--fp8-delayed is a scaling for --fp8: give --fp8 too");
  MG_CHECK(!f.fp8_fast_accum || f.fp8, ValueError, "--fp8-fast-accum is an accumulation for --fp8: give --fp8 too");
  MG_CHECK(!f.fp8 || f.amp != "off", ValueError,
           "--fp8 runs the linear layers inside the autocast region: it needs --amp bf16 or f16");
  MG_CHECK(f.amp == "off" || f.amp == "bf16" || f.amp == "f16", ValueError, "unknown --amp \"", f.amp,
           "\" (valid: off, bf16, f16)");
  if (f.recompute.rfind("planner:", 0) == 0) {
    f.planner_budget = f.recompute.substr(8);
    MG_CHECK(!f.planner_budget.empty(), ValueError, "--recompute planner:BUDGET needs a budget (60%, 512MiB, ...)");
    if (f.planner_budget.back() != '%') parse_bytes("--recompute planner:", f.planner_budget);
  } else {
    MG_CHECK(f.recompute == "none" || f.recompute == "per-block" || f.recompute == "per-block-keep" ||
                 f.recompute == "selective" || f.recompute == "per-block+selective",
             ValueError, "unknown --recompute \"", f.recompute,
             "\" (valid: none, per-block, per-block-keep, selective, per-block+selective, planner:BUDGET)");
  }
  MG_CHECK(f.offload_blocks >= 0, ValueError, "--offload-blocks must be >= 0 or auto, got ", f.offload_blocks);
  if (!f.memory_budget.empty()) {
    MG_CHECK(parse_bytes("--memory-budget", f.memory_budget) > 0, ValueError, "--memory-budget must be > 0, got ",
             f.memory_budget);
    MG_CHECK(f.recompute == "none", ValueError, "--memory-budget chooses the recomputation itself; drop --recompute ",
             f.recompute);
  }
  MG_CHECK(!f.logit_tokens.empty(), ValueError, "--tokens expects token ids A,B,...");
  MG_CHECK(f.bpe_encoder.empty() == f.bpe_vocab.empty(), ValueError,
           "--bpe-encoder and --bpe-vocab go together (GPT-2's encoder.json and vocab.bpe)");
  MG_CHECK(!f.print_logits || !f.init_from.empty(), ValueError, "--print-logits needs --init-from FILE");
  MG_CHECK(f.nproc >= 0 && f.max_batch >= 1, ValueError, "--nproc must be >= 0 and --max-batch >= 1");
  MG_CHECK(f.zero_stage >= 1 && f.zero_stage <= 3, ValueError, "--zero-stage must be 1, 2 or 3, got ", f.zero_stage);
  MG_CHECK(!f.zero_offload || f.zero_stage == 3, ValueError,
           "--zero-offload keeps ZeRO-3's shards in host memory: it needs --zero-stage 3, got ", f.zero_stage);
  if (f.zero_stage >= 2) f.zero = true;
  MG_CHECK(!(f.zero && f.amp == "f16"), ValueError,
           "--zero with --amp f16: the GradScaler steps a whole optimizer, ZeRO a shard (use bf16)");
  MG_CHECK(f.offload == "none" || f.offload == "optimizer" || f.offload == "params", ValueError, "unknown --offload \"",
           f.offload, "\" (valid: none, optimizer, params)");
  MG_CHECK(f.offload_prefetch >= 0, ValueError, "--offload-prefetch must be >= 0, got ", f.offload_prefetch);
  MG_CHECK(f.offload_optimizer_blocks == -1 || f.offload_optimizer_blocks >= 1, ValueError,
           "--offload-optimizer-blocks must be >= 1, got ", f.offload_optimizer_blocks);
  MG_CHECK((f.offload_optimizer_blocks < 0 && !f.offload_optimizer_auto) || f.offload == "optimizer", ValueError,
           "--offload-optimizer-blocks goes with --offload optimizer, got --offload ", f.offload);
  MG_CHECK(f.offload_optimizer_ratio >= 1.0, ValueError, "--offload-optimizer-ratio must be >= 1, got ",
           f.offload_optimizer_ratio);
  if (f.offload != "none") {
    MG_CHECK(f.memory_budget.empty(), ValueError,
             "--memory-budget chooses where the state lives itself; drop --offload ", f.offload);
    const std::string why = offload_conflict(f);
    MG_CHECK(why.empty(), ValueError, "--offload ", f.offload, ": ", why);
    // Under parameter offload the model is built in host memory and moves to its units at the
    // start of training: what runs on the model before that would run it on the CPU.
    MG_CHECK(f.offload != "params" || !(f.auto_batch || f.offload_auto || !f.planner_budget.empty() || f.print_logits),
             ValueError,
             "--offload params: the model stays in host memory until training starts; --auto-batch, --recompute "
             "planner:, --offload-blocks auto and --print-logits measure or run it before that");
  }
  if (f.train.warmup_steps < 0) f.train.warmup_steps = f.steps / 20;
  finalize_training_flags(f.train, 1);
  return f;
}

}  // namespace mg::examples
