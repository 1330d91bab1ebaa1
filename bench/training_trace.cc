#include "bench/training_trace.h"

#include <vector>

namespace mg::bench {

namespace {
struct Builder {
  std::vector<TraceEvent> ev;
  int64_t next = 0;
  int64_t alloc(size_t b) {
    ev.push_back({true, next, b});
    return next++;
  }
  void free(int64_t id) { ev.push_back({false, id, 0}); }
};
}  // namespace

std::vector<TraceEvent> gpt_training_step_trace(const GptShape& s, int steps) {
  Builder b;
  const size_t E = static_cast<size_t>(s.elem);
  const size_t BT = static_cast<size_t>(s.batch * s.seq);
  const size_t d = static_cast<size_t>(s.d_model);
  const size_t att = static_cast<size_t>(s.batch * s.heads * s.seq * s.seq);
  // Parameters (always f32): embeddings, per layer qkv/proj/fc/fc2 + norms.
  std::vector<size_t> params = {static_cast<size_t>(s.vocab) * d * 4, static_cast<size_t>(s.seq) * d * 4};
  for (int64_t l = 0; l < s.layers; ++l) {
    for (size_t p : {3 * d * d, 3 * d, d * d, d, 4 * d * d, 4 * d, 4 * d * d, d, d, d, d, d}) params.push_back(p * 4);
  }
  for (size_t p : params) b.alloc(p);
  std::vector<int64_t> grads;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<int64_t>> saved(s.layers);
    int64_t x = b.alloc(BT * d * E);  // embedding output
    for (int64_t l = 0; l < s.layers; ++l) {
      auto& sv = saved[l];
      int64_t ln1 = b.alloc(BT * d * E);
      int64_t qkv = b.alloc(BT * 3 * d * E);
      int64_t scores = b.alloc(att * E);
      int64_t probs = b.alloc(att * E);
      b.free(scores);
      int64_t ctx = b.alloc(BT * d * E);
      int64_t proj = b.alloc(BT * d * E);
      int64_t res1 = b.alloc(BT * d * E);
      b.free(proj);
      int64_t ln2 = b.alloc(BT * d * E);
      int64_t fc = b.alloc(BT * 4 * d * E);
      int64_t act = b.alloc(BT * 4 * d * E);
      int64_t fc2 = b.alloc(BT * d * E);
      int64_t res2 = b.alloc(BT * d * E);
      b.free(fc2);
      sv = {x, ln1, qkv, probs, ctx, res1, ln2, fc, act};
      x = res2;
    }
    int64_t logits = b.alloc(BT * static_cast<size_t>(s.vocab) * E);
    int64_t lsm = b.alloc(BT * static_cast<size_t>(s.vocab) * 4);
    b.free(logits);
    // Backward.
    int64_t glog = b.alloc(BT * static_cast<size_t>(s.vocab) * E);
    b.free(lsm);
    if (grads.empty())
      for (size_t p : params) grads.push_back(b.alloc(p));
    int64_t gx = b.alloc(BT * d * E);
    b.free(glog);
    b.free(x);
    for (int64_t l = s.layers - 1; l >= 0; --l) {
      auto& sv = saved[l];
      int64_t gfc = b.alloc(BT * 4 * d * E);
      b.free(sv[8]);
      b.free(sv[7]);
      int64_t gln2 = b.alloc(BT * d * E);
      b.free(gfc);
      b.free(sv[6]);
      int64_t gres = b.alloc(BT * d * E);
      b.free(gln2);
      b.free(gx);
      int64_t gprobs = b.alloc(att * E);
      int64_t gscores = b.alloc(att * E);
      b.free(gprobs);
      b.free(sv[3]);
      int64_t gqkv = b.alloc(BT * 3 * d * E);
      b.free(gscores);
      b.free(sv[4]);
      b.free(sv[2]);
      b.free(sv[5]);
      int64_t gln1 = b.alloc(BT * d * E);
      b.free(gqkv);
      b.free(sv[1]);
      gx = b.alloc(BT * d * E);
      b.free(gln1);
      b.free(gres);
      b.free(sv[0]);  // the block's input (previous block's output, or the embedding)
    }
    b.free(gx);
    // Optimizer temporaries (one per parameter, freed at once: the unfused path).
    for (size_t p : params) b.free(b.alloc(p));
  }
  return b.ev;
}

std::vector<TraceEvent> growing_batch_trace(size_t base_bytes, int steps, double growth) {
  Builder b;
  double scale = 1.0;
  for (int s = 0; s < steps; ++s) {
    std::vector<int64_t> live;
    size_t unit = static_cast<size_t>(static_cast<double>(base_bytes) * scale);
    for (int i = 0; i < 6; ++i) live.push_back(b.alloc(unit + static_cast<size_t>(i) * 4096));
    for (int i = 5; i >= 0; --i) b.free(live[i]);
    scale *= growth;
  }
  return b.ev;
}

}  // namespace mg::bench
