// GPT-2 (124M) training-step throughput under DistributedDataParallel on 1 vs N GPUs (scaling
// efficiency), and peak memory per GPU with and without ZeRO-1 optimizer-state sharding.
//   dist_bench --compare 2              # 1 GPU, 2 GPUs, 2 GPUs + ZeRO-1: a table
//   tools/launch --nproc 2 -- dist_bench [--zero]   # one configuration, ranks from the launcher
//   dist_bench --nproc 2 [--zero]       # the same, spawning its own ranks
//   dist_bench --nproc 2 --zero3        # ZeRO-3 (dist::fully_shard, a unit a block) instead of DDP
// Other flags: --steps S --warmup W --batch B (per GPU) --seq T --n_layer L --n_embd C
// --n_head H --vocab V --momentum M --backend cpu|nccl (cpu: a tiny model on host, a smoke test)
// --trace PATH (rank 0's last timed step as a Chrome trace, and how its all-gathers overlapped).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "autograd/functions.h"
#include "bench/flag_value.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/profiler.h"
#include "core/random.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/spawn.h"
#include "distributed/fully_shard.h"
#include "distributed/zero.h"
#include "nn/models/gpt.h"
#include "optim/sgd.h"

namespace {

using namespace mg;

struct Args {
  int nproc = 0, compare = 0;
  int steps = 5, warmup = 2, batch = 4, seq = 1024;
  int n_layer = 12, n_embd = 768, n_head = 12, vocab = 50304;
  double momentum = 0.9;
  bool zero = false;
  bool zero3 = false;  // --zero3: dist::fully_shard (each block a unit), no DDP
  std::string backend = "auto";
  std::string result_file;
  std::string trace;                     // --trace PATH: rank 0's last step as a Chrome trace
  std::vector<std::string> passthrough;  // flags a spawned rank should see
};

// --trace: writes rank 0's traced step and prints how its collectives lay against its compute:
// the time the process group's worker spent in all-gathers, and the part of it the training
// thread spent waiting for a gather ("gather wait" ranges); the rest ran under compute.
void print_overlap(const std::string& path) {
  profiler::export_chrome_trace(path);
  const std::string text = profiler::chrome_trace_json();
  const nlohmann::json trace = nlohmann::json::parse(text);
  double gather_ms = 0, wait_ms = 0, step_ms = 0, reduce_ms = 0;
  int64_t training_thread = -1;  // the thread that ran the step; the collectives' worker is another
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "step") training_thread = e["tid"].get<int64_t>();
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ms = e["dur"].get<double>() * 1e-3;
    const bool worker = e["cat"] == "collective" && e["tid"].get<int64_t>() != training_thread;
    if (e["name"] == "all_gather" && worker) gather_ms += ms;
    if (e["name"] == "reduce_scatter" && worker) reduce_ms += ms;
    if (e["name"] == "gather wait") wait_ms += ms;
    if (e["name"] == "step") step_ms += ms;
  }
  std::cout << "{\"trace\": \"" << path << "\", \"valid\": \"" << profiler::validate_chrome_trace(text)
            << "\", \"step_ms\": " << step_ms << ", \"all_gather_ms_on_the_worker\": " << gather_ms
            << ", \"reduce_scatter_ms_on_the_worker\": " << reduce_ms << ", \"gather_wait_ms\": " << wait_ms
            << ", \"all_gather_overlapped_fraction\": " << (gather_ms > 0 ? 1.0 - wait_ms / gather_ms : 0.0) << "}"
            << std::endl;
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, int*> ints = {{"--nproc", &a.nproc},     {"--compare", &a.compare}, {"--steps", &a.steps},
                                      {"--warmup", &a.warmup},   {"--batch", &a.batch},     {"--seq", &a.seq},
                                      {"--n_layer", &a.n_layer}, {"--n_embd", &a.n_embd},   {"--n_head", &a.n_head},
                                      {"--vocab", &a.vocab}};
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&] { return mg::bench::flag_value("dist_bench", argc, argv, i); };
    if (k.rfind("--benchmark", 0) == 0) continue;  // tools/run_staged.sh passes Google Benchmark flags
    if (ints.count(k)) {
      *ints[k] = std::stoi(next());
      if (k != "--nproc" && k != "--compare") a.passthrough.insert(a.passthrough.end(), {k, argv[i]});
    } else if (k == "--zero") {
      a.zero = true;
      a.passthrough.push_back(k);
    } else if (k == "--zero3") {
      a.zero3 = true;
      a.passthrough.push_back(k);
    } else if (k == "--momentum") {
      a.momentum = std::stod(next());
      a.passthrough.insert(a.passthrough.end(), {k, argv[i]});
    } else if (k == "--backend") {
      a.backend = next();
      a.passthrough.insert(a.passthrough.end(), {k, argv[i]});
    } else if (k == "--result") {
      a.result_file = next();
    } else if (k == "--trace") {
      a.trace = next();
      a.passthrough.insert(a.passthrough.end(), {k, argv[i]});
    } else {
      std::cerr << "dist_bench: unknown flag " << k << "\n";
      std::exit(2);
    }
  }
  return a;
}

// One rank of one configuration; rank 0 prints (and writes) a JSON line.
int run_rank(const Args& a) {
  dist::ProcessGroupOptions po;
  if (a.backend == "cpu") po.backend = dist::Backend::Cpu;
  if (a.backend == "nccl") po.backend = dist::Backend::Nccl;
  auto pg = dist::init_process_group(po);
  const Device dev = pg->device();
  const bool gpu = dev.is_cuda();
  if (!gpu && a.backend != "cpu") {
    if (pg->rank() == 0) std::cout << "dist_bench: no GPU; skipping (use --backend cpu for a host smoke test)\n";
    return 0;
  }
  nn::GPTConfig cfg;
  cfg.n_layer = a.n_layer;
  cfg.n_embd = a.n_embd;
  cfg.n_head = a.n_head;
  cfg.vocab_size = a.vocab;
  cfg.block_size = std::max(a.seq, 1);
  Generator init_gen(1234);
  reset_peak_memory_stats(dev);
  auto model = std::make_shared<nn::GPT>(cfg, TensorOptions{DType::f32, dev}, &init_gen);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  dist::FullyShardedModel fsdp;
  if (a.zero3) {
    fsdp = dist::fully_shard(nn::gpt_param_units(*model), pg);
    model->recompute.units = fsdp.units.get();
  } else {
    ddp = std::make_unique<dist::DistributedDataParallel>(model, pg);
  }
  const optim::SGDOptions so{.lr = 1e-4, .momentum = a.momentum};
  std::unique_ptr<optim::SGD> sgd;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  if (a.zero)
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
        model->parameters(), pg, [&](std::vector<Tensor> s) { return std::make_unique<optim::SGD>(s, so); });
  else
    sgd = std::make_unique<optim::SGD>(a.zero3 ? fsdp.source->shards() : model->parameters(), so);

  Generator data_gen(99 + pg->rank());
  double loss_value = 0;
  auto step = [&]() {
    Tensor tok = raw::to_device(randint(0, cfg.vocab_size, {a.batch, a.seq + 1}, {DType::i64}, &data_gen), dev);
    Tensor idx = raw::contiguous(raw::slice(tok, 1, 0, a.seq, 1));
    Tensor tgt = raw::contiguous(raw::slice(tok, 1, 1, a.seq + 1, 1));
    Tensor loss = nn::GPT::loss(ddp ? (*ddp)(idx) : (*model)(idx), tgt);
    loss.backward();
    if (zero) {
      zero->step();
      zero->zero_grad();
    } else {
      sgd->step();
      sgd->zero_grad();
    }
    loss_value = loss.item();
  };
  for (int i = 0; i < a.warmup; ++i) step();
  if (gpu) cuda::synchronize();
  pg->barrier();
  const double wait0 = a.zero3 ? fsdp.units->stats().wait_ms : 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) {
    // --trace: rank 0 records the last timed step (every rank runs the same code).
    const bool traced = !a.trace.empty() && pg->rank() == 0 && i == a.steps - 1;
    if (traced) profiler::start();
    {
      profiler::Range r("step", "phase");
      step();
    }
    if (traced) profiler::stop();
  }
  if (gpu) cuda::synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The slowest rank sets the pace; memory is reported as the largest per-GPU peak.
  Tensor stats = raw::to_device(
      from_vector(
          std::vector<float>{static_cast<float>(secs), static_cast<float>(max_memory_allocated(dev) / 1048576.0)}, {2}),
      dev);
  pg->all_reduce(stats, dist::ReduceOp::Max);
  auto sv = stats.cpu().to_vector<double>();
  const double step_s = sv[0] / std::max(a.steps, 1);
  const int64_t state = zero ? zero->state_nbytes() : sgd->state_nbytes();
  if (pg->rank() == 0) {
    std::ostringstream js;
    js << "{\"world\": " << pg->size() << ", \"zero\": " << (a.zero ? "true" : "false")
       << ", \"zero3\": " << (a.zero3 ? "true" : "false") << ", \"batch_per_rank\": " << a.batch
       << ", \"seq\": " << a.seq << ", \"params\": " << model->num_parameters() << ", \"step_ms\": " << step_s * 1000
       << ", \"tokens_per_s\": " << a.batch * a.seq * pg->size() / step_s << ", \"peak_allocated_mib\": " << sv[1]
       << ", \"optimizer_state_mib_rank0\": " << state / 1048576.0 << ", \"gather_wait_ms_per_step\": "
       << (a.zero3 ? (fsdp.units->stats().wait_ms - wait0) / std::max(a.steps, 1) : 0.0)
       << ", \"ddp_bucket_mib\": " << (ddp ? ddp->bucket_bytes() : 0) / 1048576.0 << ", \"loss\": " << loss_value
       << ", \"device\": \"" << (gpu ? cuda::get_device_properties(dev.index).name : std::string("cpu")) << "\"}";
    std::cout << js.str() << std::endl;
    if (!a.result_file.empty()) std::ofstream(a.result_file, std::ios::app) << js.str() << "\n";
    if (!a.trace.empty()) print_overlap(a.trace);
  }
  return 0;
}

int spawn(const Args& a, int nproc, bool zero_flag, const std::string& result) {
  dist::SpawnOptions o;
  o.nproc = nproc;
  o.args = a.passthrough;
  if (zero_flag && !a.zero) o.args.push_back("--zero");
  if (!zero_flag) std::erase(o.args, std::string("--zero"));
  if (!result.empty()) o.args.insert(o.args.end(), {"--result", result});
  dist::SpawnResult r = dist::spawn_ranks(o);
  if (r.exit_code != 0) std::cerr << "dist_bench: " << r.message << "\n";
  return r.exit_code;
}

double field(const std::string& line, const std::string& key) {
  auto p = line.find("\"" + key + "\": ");
  return p == std::string::npos ? 0 : std::stod(line.substr(p + key.size() + 4));
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  const bool is_rank = std::getenv("RANK") != nullptr;
  try {
    if (!is_rank && a.compare > 0) {
      const int n = a.compare;
      if (a.backend != "cpu" && cuda::device_count() < n) {
        std::cout << "dist_bench: --compare " << n << " needs " << n << " GPUs, " << cuda::device_count()
                  << " visible; skipping\n";
        return 0;
      }
      char path[] = "/tmp/mg_dist_bench_XXXXXX";
      int fd = mkstemp(path);
      close(fd);
      for (auto [np, z] : std::vector<std::pair<int, bool>>{{1, false}, {n, false}, {n, true}})
        if (int rc = spawn(a, np, z, path)) return rc;
      std::ifstream f(path);
      std::vector<std::string> lines;
      for (std::string l; std::getline(f, l);) lines.push_back(l);
      std::remove(path);
      if (lines.size() != 3) return 1;
      const double t1 = field(lines[0], "tokens_per_s"), tn = field(lines[1], "tokens_per_s");
      std::printf("\n%-22s %12s %14s %16s %18s\n", "configuration", "step ms", "tokens/s", "peak MiB / GPU",
                  "optim state MiB");
      const char* names[] = {"1 GPU", "N GPUs, DDP", "N GPUs, DDP + ZeRO-1"};
      for (int i = 0; i < 3; ++i)
        std::printf("%-22s %12.1f %14.0f %16.0f %18.1f\n", names[i], field(lines[i], "step_ms"),
                    field(lines[i], "tokens_per_s"), field(lines[i], "peak_allocated_mib"),
                    field(lines[i], "optimizer_state_mib_rank0"));
      std::printf("N = %d: speed-up %.2fx, scaling efficiency %.1f%% (weak scaling: batch per GPU fixed)\n", n, tn / t1,
                  100.0 * tn / (n * t1));
      return 0;
    }
    if (!is_rank && a.nproc > 0) return spawn(a, a.nproc, a.zero, a.result_file);
    return run_rank(a);
  } catch (const std::exception& e) {
    std::cerr << "dist_bench: " << e.what() << "\n";
    return 1;
  }
}
