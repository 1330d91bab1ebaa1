// examples:gpt2's flags: a preset (tiny, small, gpt2) with per-field overrides, data and
// tokenizer, sampling, pretrained weights, and every memory technique (--amp, --recompute,
// --grad-accum, --auto-batch, --zero, --nproc, --save/--resume).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "examples/training_setup.h"
#include "nn/models/gpt.h"

namespace mg::examples {

struct GPT2Flags {
  std::string preset = "tiny";
  bool n_head_given = false;  // --n-head on the command line (--init-from: else n_embd / 64)
  nn::GPTConfig model;        // the preset's shape with --n-layer/--n-embd/--n-head/--block-size/--dropout
  int64_t vocab_size = 0;     // 0: the tokenizer's (the gpt2 preset: 50304, GPT-2's padded to 64)
  int64_t batch = 0;          // sequences per optimizer step (all micro-batches of one rank)
  int64_t steps = 0;
  int64_t grad_accum = 1;  // micro-batches per step
  int64_t eval_every = 0, eval_iters = 0;
  int64_t sample_every = 0, max_new_tokens = 0;
  double temperature = 0.8;
  int64_t top_k = 40;
  std::string prompt = "\n";
  double val_fraction = 0.1;
  std::string data;  // empty: the corpus built from the project's docs and sources
  std::string bpe_encoder, bpe_vocab;
  std::string init_from;  // Hugging Face GPT-2 safetensors
  bool print_logits = false;
  std::string logits_out;  // --print-logits: all logits as safetensors
  std::vector<int64_t> logit_tokens = {15496, 11, 314, 1101, 257, 3303, 2746, 13};  // "Hello, I'm a language model."
  std::string amp = "off";                                                          // off | bf16 | f16
  std::string recompute = "none";  // none | per-block | selective | per-block+selective | planner:BUDGET
  std::string planner_budget;      // BUDGET of planner:BUDGET ("60%", "512MiB", "2GiB", bytes)
  std::string memory_budget;       // --memory-budget: the whole step's peak ("3.5GiB", bytes); empty: off
  int64_t offload_blocks = 0;      // --offload-blocks: the first N blocks' saved tensors go to host memory
  bool offload_auto = false;       // --offload-blocks auto: N planned from the host link and the blocks' times
  bool auto_batch = false;
  int64_t max_batch = 1024;  // --auto-batch never tries more sequences per micro-batch
  bool zero = false;
  int zero_stage = 1;         // --zero-stage: 1 (optimizer state) or 2 (and the gradients, without DDP)
  bool zero_offload = false;  // --zero-offload: ZeRO-3's shards in host memory
  // --offload: where the model state lives on one GPU. none; optimizer (the blocks' Linear
  // parameters' masters and moments in host memory, updated there inside backward:
  // memory/host_params.h); params (every parameter in host memory, a block on the device while it
  // runs: memory/param_offload.h). --memory-budget may choose either.
  std::string offload = "none";
  int offload_prefetch = 1;               // --offload-prefetch: blocks fetched ahead under --offload params
  int64_t offload_optimizer_blocks = -1;  // --offload-optimizer-blocks: the last N blocks' (-1: every block)
  // --offload-optimizer-blocks auto: the most blocks whose timed step stays within
  // --offload-optimizer-ratio of the resident step (memory::search_host_param_blocks).
  bool offload_optimizer_auto = false;
  double offload_optimizer_ratio = 1.3;
  bool fp8 = false;                                   // --fp8: the linear layers' GEMMs in FP8 (mg::Fp8Autocast)
  int64_t fp8_min_features = kFp8DefaultMinFeatures;  // --fp8-min-features: narrower linears keep bf16
  bool fp8_delayed = false;                           // --fp8-delayed: Fp8Scaling::Delayed
  bool fp8_fast_accum = false;                        // --fp8-fast-accum: Fp8Accumulation::Fast
  int nproc = 0;
  std::string save, resume;
  std::string trace;        // --trace: the third step's Chrome trace (core/profiler.h)
  int64_t stop_after = -1;  // end after this step, as a preempted job would
  uint64_t seed = 0;
  std::string device;
  bool progress = true;
  TrainingFlags train;                   // --optimizer, --lr, --scheduler, --warmup-steps, --clip-grad-norm ...
  std::vector<std::string> passthrough;  // the command line less --nproc, for spawned ranks
};

extern const char* kGPT2Usage;

// Parses and checks argv; bad flags or values are an mg::ValueError naming the flag. --help
// prints the usage and exits.
GPT2Flags parse_gpt2_flags(int argc, char** argv);

// Why the run's other flags rule out --offload (and --memory-budget's offload modes); empty when
// they allow it.
std::string offload_conflict(const GPT2Flags& f);

// Bytes from "512MiB", "2GiB", "1.5GB", "123456"; ValueError otherwise.
int64_t parse_bytes(const std::string& flag, const std::string& v);

}  // namespace mg::examples
