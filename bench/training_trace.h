// A synthetic but faithful allocation trace of one transformer training step (forward
// saves activations layer by layer, backward frees them in reverse while allocating
// gradients), used to measure what an allocator reserves against what is live.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mg::bench {

struct TraceEvent {
  bool alloc;  // true: allocate `bytes` under `id`; false: free `id`
  int64_t id;
  size_t bytes;
};

struct GptShape {
  int64_t batch = 8, seq = 1024, d_model = 768, heads = 12, layers = 12, vocab = 50304;
  int64_t elem = 4;  // bytes per element (4 = f32, 2 = f16/bf16 activations)
};

// Parameters and their gradients stay live across the step (allocated on the first step);
// activations follow the forward/backward pattern of a GPT block.
std::vector<TraceEvent> gpt_training_step_trace(const GptShape& s, int steps = 2);

// A growing-batch pattern (adaptive batch size): each step's activations are larger than
// the previous one's, the case where cached segments get stranded.
std::vector<TraceEvent> growing_batch_trace(size_t base_bytes, int steps, double growth);

}  // namespace mg::bench
