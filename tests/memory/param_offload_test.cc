// Parameter offload (memory/param_offload.h): a GPT whose every parameter lives in pinned host
// memory, a block's on the device only while it runs, trains as the same GPT kept on the device
// and updated by the same host AdamW; the device holds no model state; what bad input says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <unistd.h>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "memory/param_offload.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "serialize/training_checkpoint.h"
#include "tests/error_of.h"

namespace mg::memory {
namespace {

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = 97, c.block_size = 16, c.n_layer = 3, c.n_head = 2, c.n_embd = 64;
  return c;
}

// eps 1e-3: see GptTrainsAsTheDeviceResidentModel.
optim::AdamWOptions adamw() {
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.eps = 1e-3;
  return o;
}

// 20 AdamW steps under bf16 autocast, every block checkpointed on both sides. Reference: the
// model on the device, its f32 gradients copied to host masters that a CPU AdamW steps, the
// masters copied back. Offloaded: the masters in pinned host memory stepped by HostParams' worker
// with the same CPU AdamW loop, a block's bf16 Linear parameters and f32 norms fetched per unit.
// The forward reads the same bf16 casts (round to nearest even on either side), the gradients
// come from the same GEMMs in f32 (the sink's grad_dtype), the update is the same loop on the same
// elements. What still differs is the device's own run to run: backward kernels that accumulate
// atomically (the embedding's) sum in any order, so two device runs differ in the gradients'
// last bits. With AdamW's usual eps (1e-8) an element whose gradient is rounding noise (the
// attention's key bias has a zero gradient in exact arithmetic) takes a full step of +-lr in
// whichever direction the noise points: on the H100 two runs drifted 0.13 apart there in 20
// steps. With eps 1e-3 such noise (|g| ~ 1e-9) moves nothing, and a gradient difference dg moves
// an update by at most lr |dg| / eps: |dg| <= gamma_k sum |terms| ~ 1e-6 here, so 1e-5 a step
// from the rounding alone; the parameters' differences then feed back through the forward, and
// the H100 measured 9.3e-4 after 20 steps. Bound: 2e-3, a fifth of one step's full move (lr
// 1e-2); a stale or wrong unit moves every element of it by about lr a step. The largest
// difference is printed.
TEST(ParamOffload, GptTrainsAsTheDeviceResidentModel) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  Generator g1(3), g2(3);
  nn::GPT ref(tiny(), {}, &g1), off(tiny(), {}, &g2);
  ref.to(dev);
  ref.recompute.checkpoint_blocks = off.recompute.checkpoint_blocks = true;
  std::vector<Tensor> masters;
  for (const Tensor& p : ref.parameters()) masters.push_back(nn::parameter(p.detach().cpu().clone()));
  optim::AdamW ref_opt(masters, adamw());
  std::map<std::string, Tensor> ref_master;
  {
    const auto named = ref.named_parameters();
    for (size_t i = 0; i < named.size(); ++i) ref_master[named[i].first] = masters[i];
  }
  const auto names = off.named_parameters();
  ParamOffload po =
      offload_gpt_params(off, dev, [](std::vector<Tensor> ps) { return std::make_unique<optim::AdamW>(ps, adamw()); });
  Generator data(9);
  for (int step = 0; step < 20; ++step) {
    Tensor idx = randint(0, 97, {4, 17}, {DType::i64}, &data).to(dev);
    Tensor x = idx.slice(1, 0, 16).contiguous(), y = idx.slice(1, 1, 17).contiguous();
    {
      Autocast ac(DeviceType::CUDA, DType::bf16);
      ref.forward_loss(x, y).backward();
    }
    const auto rp = ref.parameters();
    for (size_t i = 0; i < rp.size(); ++i) masters[i].set_grad(rp[i].grad().cpu());
    ref_opt.step();
    ref_opt.zero_grad();
    ref.zero_grad();
    {
      NoGradGuard ng;
      for (size_t i = 0; i < rp.size(); ++i) raw::copy_(rp[i], masters[i].to(dev));
    }
    {
      Autocast ac(DeviceType::CUDA, DType::bf16);
      off.forward_loss(x, y).backward();
    }
  }
  po.source->host().wait();
  // Each offloaded parameter's master: its unit group's slice.
  std::map<const TensorImpl*, std::string> name_of;
  for (const auto& [n, p] : names) name_of[p.impl()] = n;
  int compared = 0;
  double worst = 0;
  for (size_t u = 0; u < po.units->size(); ++u)
    for (size_t g = 0; g < po.units->groups(u).size(); ++g) {
      const UnitGroup& grp = po.units->groups(u)[g];
      const Tensor& m = po.source->master(u, g);
      for (size_t k = 0; k < grp.params.size(); ++k) {
        const std::string& n = name_of.at(grp.params[k].impl());
        Tensor mine = m.slice(0, grp.offsets[k], grp.offsets[k] + grp.params[k].numel()).reshape(grp.params[k].sizes());
        const std::vector<float> a = mine.to_vector<float>(), b = ref_master.at(n).to_vector<float>();
        double d = 0;
        for (size_t j = 0; j < a.size(); ++j) d = std::max(d, static_cast<double>(std::fabs(a[j] - b[j])));
        worst = std::max(worst, d);
        EXPECT_LE(d, 2e-3) << n << " after 20 steps";
        ++compared;
      }
    }
  EXPECT_EQ(compared, static_cast<int>(names.size()));
  std::printf("parameter offload vs device-resident, 20 AdamW steps: largest difference %.3g\n", worst);
  const HostParams::Stats st = po.source->host().stats();
  EXPECT_EQ(st.updates, 20 * static_cast<int64_t>(po.source->host().params().size()));
  EXPECT_LE(po.units->stats().peak_gathered_units, 2);
}

// The device holds no parameter, gradient or optimizer state between steps: each category is
// where it was before the model came, and the gathered parameters peaked at the root and two
// blocks. Reading a parameter outside its unit is an error naming the released storage.
TEST(ParamOffload, TheDeviceHoldsNoModelState) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  CategoryStats& cs = CategoryStats::get(dev);
  const MemoryCategory state[] = {MemoryCategory::Parameters, MemoryCategory::Gradients, MemoryCategory::OptimizerState,
                                  MemoryCategory::Gathered};
  std::vector<int64_t> before;
  for (MemoryCategory c : state) before.push_back(cs.counter(c).current);
  nn::GPT m(tiny());
  ParamOffload po =
      offload_gpt_params(m, dev, [](std::vector<Tensor> ps) { return std::make_unique<optim::AdamW>(ps, adamw()); });
  cs.reset_peak();
  Tensor idx = randint(0, 97, {2, 17}, {DType::i64}).to(dev);
  for (int step = 0; step < 2; ++step) {
    Autocast ac(DeviceType::CUDA, DType::bf16);
    m.forward_loss(idx.slice(1, 0, 16).contiguous(), idx.slice(1, 1, 17).contiguous()).backward();
  }
  po.source->host().wait();
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(cs.counter(state[i]).current, before[i]) << memory_category_name(state[i]);
  EXPECT_LE(cs.counter(MemoryCategory::Gathered).peak - before[3],
            po.units->unit_bytes(0) + 2 * po.units->unit_bytes(1));
  const Tensor w = m.block(0).parameters()[0];
  EXPECT_NE(testing::error_of([&] { (void)w.cpu(); }).find("released"), std::string::npos);
}

// Checkpoints in the model's layout (model_state_dict & co.). The steps take synthetic gradients
// by parameter name (a generator of the step's own): the same values in both modes, where the
// attention backward on the device would differ in the last bits from run to run.
std::map<std::string, Tensor> synthetic_grads(const nn::Module& model, int step) {
  Generator g(500 + step);
  std::map<std::string, Tensor> out;
  for (const auto& [n, p] : model.named_parameters()) out[n] = randn(p.sizes(), {}, &g) * 1e-2;
  return out;
}

const HostOptimizerFactory kAdamW = [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
  return std::make_unique<optim::AdamW>(ps, adamw());
};

// A GPT under parameter offload, from `seed`.
struct OffloadRun {
  std::unique_ptr<nn::GPT> model;
  ParamOffload po;
  explicit OffloadRun(uint64_t seed, const HostOptimizerFactory& f = kAdamW) {
    Generator g(seed);
    model = std::make_unique<nn::GPT>(tiny(), TensorOptions{}, &g);
    po = offload_gpt_params(*model, Device::cuda(0), f);
  }
  // One step: each master's gradient packed from the synthetic ones, as its unit's reduce would.
  void step(int s) {
    const auto grads = synthetic_grads(*model, s);
    std::map<const TensorImpl*, std::string> name_of;
    for (const auto& [n, p] : model->named_parameters()) name_of[p.impl()] = n;
    HostParams& h = po.source->host();
    for (size_t u = 0; u < po.units->size(); ++u)
      for (size_t g = 0; g < po.units->groups(u).size(); ++g) {
        const UnitGroup& grp = po.units->groups(u)[g];
        Tensor flat = zeros({grp.padded});
        for (size_t k = 0; k < grp.params.size(); ++k)
          raw::copy_(flat.slice(0, grp.offsets[k], grp.offsets[k] + grp.params[k].numel()),
                     grads.at(name_of.at(grp.params[k].impl())).reshape({-1}));
        h.add_gradient(po.source->master_index(u, g), flat.to(Device::cuda(0)));
      }
    h.start_round();
    h.wait();
  }
  // The loss on a fixed batch, no gradients: what the fetched casts give.
  float fixed_loss() {
    Generator data(99);
    const Tensor idx = randint(0, 97, {2, 17}, {DType::i64}, &data).to(Device::cuda(0));
    float l = 0;
    {
      NoGradGuard ng;
      Autocast ac(DeviceType::CUDA, DType::bf16);
      l = model->forward_loss(idx.slice(1, 0, 16).contiguous(), idx.slice(1, 1, 17).contiguous()).item<float>();
    }
    po.units->release_all();
    return l;
  }
  serialize::TrainingCheckpoint checkpoint() {
    serialize::TrainingCheckpoint ck;
    ck.add(
        "model", [this] { return model_state_dict(po, *model); },
        [this](const StateDict& sd) { load_model_state_dict(po, *model, sd); });
    ck.add("optimizer", po.source->host());
    return ck;
  }
};

std::string temp_path(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::filesystem::path d =
      std::filesystem::path(t ? t : "/tmp") / ("param_offload_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return (d / name).string();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.cpu().to_vector<float>(), y = b.cpu().to_vector<float>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Saved at step 4 in the masters' layout and resumed by a fresh model (other initial values):
// the fixed batch's loss is the saved run's bit for bit (the casts were written again from the
// loaded masters) and three more steps give the same masters.
TEST(ParamOffload, CheckpointResumesBitIdentically) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string path = temp_path("param_offload.ckpt");
  OffloadRun a(3);
  for (int s = 0; s < 4; ++s) a.step(s);
  a.checkpoint().save(path);
  const float loss = a.fixed_loss();
  for (int s = 4; s < 7; ++s) a.step(s);
  const StateDict want = model_state_dict(a.po, *a.model);

  OffloadRun b(11);
  serialize::TrainingCheckpoint ck = b.checkpoint();
  ck.load(path);
  EXPECT_EQ(b.fixed_loss(), loss);
  for (int s = 4; s < 7; ++s) b.step(s);
  const StateDict got = model_state_dict(b.po, *b.model);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [n, t] : want.tensors) EXPECT_TRUE(same_bits(got.tensors.at(n), t)) << n;
}

// The same state by name into the device-resident mode and back. Resident: the model loads
// model_state_dict as it is, and one AdamW over it loads optimizer_named_state laid out by
// optim::merge_state_dicts; its step from the same values, moments and gradients is the
// offloaded run's up to the rounding of the update, which the host loop and the CUDA kernel
// order differently (fused multiply-adds, where the bias corrections and lr are applied). The
// step s = p_old (1 - lr wd) - p_new is at most |p_old| + |p_new| <= 2 m, m = max(|p_old|,
// |p_new|); each side rounds it through at most 6 operations (the moments' updates, the bias
// corrections, the square root, the division, the product with lr), 2^-24 of 2m each, and the
// decay and the subtraction once more: 2 x 6 x 2 + 2 = 26 units of 2^-24 m, at most 26 ulps of
// m. (Here lr is 1e-2 with eps 1e-3, so s is not small against the parameters the LN biases
// and positions start near zero with.) Back: a fresh offloaded model loads the resident state and
// gives it back bit for bit.
TEST(ParamOffload, CheckpointConvertsToAndFromTheResidentMode) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  OffloadRun a(3);
  for (int s = 0; s < 4; ++s) a.step(s);
  const StateDict ms = model_state_dict(a.po, *a.model);
  const optim::NamedState ns = optimizer_named_state(a.po, *a.model);
  a.step(4);
  const StateDict after = model_state_dict(a.po, *a.model);

  Generator g(5);
  nn::GPT m(tiny(), {}, &g);
  m.to(dev);
  m.load_state_dict(ms);
  optim::AdamW one(m.parameters(), adamw());
  one.load_state_dict(optim::merge_state_dicts({ns}, optim::named_state(one, m.named_parameters())));
  for (const Tensor& p : m.parameters()) {
    ASSERT_NE(one.state(p), nullptr);
    EXPECT_EQ(one.state(p)->step, 4);
  }
  const auto grads = synthetic_grads(m, 4);
  for (const auto& [n, p] : m.named_parameters()) Tensor(p).set_grad(grads.at(n).to(dev));
  one.step();
  double worst = 0;
  for (const auto& [n, p] : m.named_parameters()) {
    const std::vector<float> got = p.cpu().to_vector<float>(), want = after.tensors.at(n).to_vector<float>();
    const std::vector<float> before = ms.tensors.at(n).to_vector<float>();
    for (size_t j = 0; j < got.size(); ++j) {
      const float mag = std::max(std::fabs(before[j]), std::fabs(want[j]));
      const double ulp = std::nextafter(mag, INFINITY) - mag;
      worst = std::max(worst, std::fabs(double(got[j]) - want[j]) / ulp);
    }
  }
  EXPECT_LE(worst, 26.0);
  std::printf("parameter offload checkpoint resumed resident, one step: at most %.1f ulps\n", worst);

  OffloadRun c(13);
  load_model_state_dict(c.po, *c.model, m.state_dict());
  load_optimizer_named_state(c.po, *c.model, optim::named_state(one, m.named_parameters()));
  const StateDict back = model_state_dict(c.po, *c.model);
  for (const auto& [n, p] : m.named_parameters()) EXPECT_TRUE(same_bits(back.tensors.at(n), p)) << n;
  const optim::NamedState nb = optimizer_named_state(c.po, *c.model);
  const optim::NamedState nr = optim::named_state(one, m.named_parameters());
  std::map<std::string, size_t> index_b;
  for (size_t i = 0; i < nb.names.size(); ++i) index_b[nb.names[i]] = i;
  int compared = 0;
  for (size_t i = 0; i < nr.names.size(); ++i)
    for (const char* buf : {"exp_avg", "exp_avg_sq"}) {
      const std::string kr = "state." + std::to_string(i) + "." + buf;
      const std::string kb = "state." + std::to_string(index_b.at(nr.names[i])) + "." + buf;
      ASSERT_TRUE(nr.state.tensors.count(kr) && nb.state.tensors.count(kb)) << nr.names[i] << " " << buf;
      EXPECT_TRUE(same_bits(nb.state.tensors.at(kb), nr.state.tensors.at(kr))) << nr.names[i] << " " << buf;
      ++compared;
    }
  EXPECT_EQ(compared, 2 * static_cast<int>(nr.names.size()));
}

TEST(ParamOffload, CheckpointBadInputNamesTheParameter) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  OffloadRun a(3);
  StateDict sd = model_state_dict(a.po, *a.model);
  const std::string name = sd.tensors.begin()->first;
  StateDict missing = sd;
  missing.tensors.erase(name);
  EXPECT_NE(testing::error_of([&] { load_model_state_dict(a.po, *a.model, missing); }).find(name), std::string::npos);
  StateDict wrong = sd;
  wrong.tensors[name] = zeros({3});
  EXPECT_THROW(load_model_state_dict(a.po, *a.model, wrong), ShapeError);
  StateDict extra = sd;
  extra.tensors["no.such.weight"] = zeros({3});
  EXPECT_NE(testing::error_of([&] { load_model_state_dict(a.po, *a.model, extra); }).find("no.such.weight"),
            std::string::npos);
  // Nothing changed: the masters are the first dict's values.
  const StateDict now = model_state_dict(a.po, *a.model);
  for (const auto& [n, t] : sd.tensors) EXPECT_TRUE(same_bits(now.tensors.at(n), t)) << n;
  // 8-bit moments span a unit's parameters: not sliceable by parameter.
  OffloadRun q(3, [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW8bit>(ps, optim::AdamW8bitOptions());
  });
  q.step(0);
  EXPECT_NE(testing::error_of([&] { (void)optimizer_named_state(q.po, *q.model); }).find("8-bit"), std::string::npos);
}

}  // namespace
}  // namespace mg::memory
