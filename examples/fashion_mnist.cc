// The main job: trains an MLP or a CNN (--model cnn) on Fashion-MNIST with SGD, Adam or
// AdamW (--optimizer), an LR scheduler (--scheduler) and optional clipping, and reports the test accuracy and the peak
// memory by category (parameters, gradients, optimizer state, ...).
//
//   bazel run //examples:fashion_mnist -- --epochs 2 --batch-size 64 --seed 0
//
// The last stdout line is one JSON object (see docs/training.md) for scripts to parse.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/profiler.h"
#include "core/random.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "kernels/ops.h"
#include "nn/nn.h"
#include "examples/run_report.h"
#include "examples/training_setup.h"
#include "serialize/training_checkpoint.h"
#include "core/captured_step.h"
#include "optim/grad_scaler.h"
#include "optim/clip_grad.h"

namespace {

using mg::examples::at_peak_bytes;
using mg::examples::Clock;
using mg::examples::memory_line;
using mg::examples::peak_bytes;
using mg::examples::seconds_since;

const std::vector<std::string> kModels = {"mlp", "cnn"};
// Per-model recipe defaults (measured with seed 0, see docs/training.md): SGD lr 0.02
// momentum 0.9, per-batch cosine annealing for the CNN.
std::string default_scheduler(const std::string& model) { return model == "cnn" ? "cosine" : "none"; }

// --cuda-graph: full-size batches go through one captured training step fed from static input
// tensors. The capture's warm-up step trains on the batch at hand. The optimizer and the
// GradScaler are capturable (lr, step counts, loss scale and overflow skip in device memory),
// so the schedule's learning rates and dropout's fresh masks reach every replay without a new
// capture.
class GraphedStep {
 public:
  using Step = std::function<mg::Tensor(const mg::Tensor&, const mg::Tensor&)>;
  explicit GraphedStep(Step step) : step_(std::move(step)) {}

  mg::Tensor step(const mg::Tensor& x, const mg::Tensor& y) {
    if (!x_.defined()) {
      x_ = mg::empty(x.sizes(), {x.dtype(), x.device()});
      y_ = mg::empty(y.sizes(), {y.dtype(), y.device()});
    }
    mg::raw::copy_(x_, x);
    mg::raw::copy_(y_, y);
    if (captured_) {
      captured_->replay();
      return loss_;
    }
    captured_ = std::make_unique<mg::CapturedStep>([this] { loss_ = step_(x_, y_); }, 1);
    ++captures_;
    return loss_;
  }
  int64_t captures() const { return captures_; }

 private:
  Step step_;
  std::unique_ptr<mg::CapturedStep> captured_;
  mg::Tensor x_, y_, loss_;
  int64_t captures_ = 0;
};

struct Flags {
  int64_t epochs = 2;
  int64_t batch_size = 64;
  mg::examples::TrainingFlags train;   // optimizer, scheduler, clipping
  int workers = 0;                     // DataLoader worker threads
  std::string amp = "off";             // off, f16 (+ GradScaler) or bf16 autocast
  std::string save_path, resume_path;  // training checkpoints (safetensors, atomic)
  std::string trace_path;              // --trace: the third training batch as a Chrome trace
  int64_t stop_after = -1;             // end the run after this epoch (as if preempted)
  bool pin_memory = false;
  bool cuda_graph = false;  // replay one captured training step (mg::CapturedStep)
  double dropout = 0.0;
  std::vector<int64_t> hidden = {256, 128};
  uint64_t seed = 0;
  std::string model = "mlp";
  std::string device;  // empty: cuda when available, else cpu
  int64_t limit_train = -1;
  int64_t eval_batch_size = 1000;
  std::string data_dir;
  bool progress = true;
};

const char* kUsage = R"(usage: fashion_mnist [flags]

Trains an MLP or a CNN on Fashion-MNIST (SGD + momentum by default); prints the test
accuracy and the peak memory by category after each epoch, and one JSON line at the end.

  --epochs N          passes over the training set (default 2)
  --batch-size N      training batch size (default 64)
  --dropout P         dropout after each hidden ReLU, 0 = none (default 0)
  --hidden A,B,...    hidden layer widths (default 256,128)
  --seed N            seeds init, dropout and shuffling (default 0)
  --model NAME        model architecture (default mlp): mlp (Linear layers of --hidden
                      widths) or cnn (two Conv3x3-BatchNorm-ReLU-MaxPool2 blocks with
                      32 and 64 channels, then Linear 3136-128-10; --dropout applies
                      after its hidden ReLU)
  --device D          cpu, cuda or cuda:N (default: cuda when available, else cpu)
  --limit-train N     train on the first N images only (default: all 60000)
  --eval-batch-size N test-set batch size (default 1000)
  --data-dir PATH     directory with the IDX .gz files (default $MG_FASHION_MNIST or
                      /usr/share/datasets/fashion-mnist)
  --amp MODE          off (default), f16 (autocast + GradScaler; CUDA) or bf16 (autocast)
  --save PATH         write a training checkpoint (model, optimizer, schedule, GradScaler,
                      RNG, epoch) to PATH after every epoch, atomically
  --trace PATH        record the third training batch (forward, backward, step) as a Chrome trace
                      to open in Perfetto (docs/profiling.md)
  --resume PATH       continue from a checkpoint written by --save with the same flags
  --stop-after N      end this run after epoch N, as a preempted job would (with --save,
                      a later --resume finishes it bit-identically)
  --workers N         DataLoader worker threads (default 0: load in the training thread)
  --pin-memory        page-locked batches copied to the device on a side stream (CUDA only)
  --cuda-graph        capture the training step in a CUDA graph and replay it for every
                      full batch (the last, smaller one runs eagerly); the optimizer and
                      GradScaler keep their state on the device (docs/cuda_graphs.md). CUDA
  --no-progress       no progress bar on stderr
  --help              this text

Optimizer, schedule and clipping:
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "fashion_mnist: " << msg << "\n(run with --help for the list of flags)\n";
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  const mg::examples::CommandLine command_line = {
      .usage = std::string(kUsage) + mg::examples::kTrainingUsage,
      .switches = {{"--no-progress", {&f.progress, false}},
                   {"--pin-memory", {&f.pin_memory, true}},
                   {"--cuda-graph", {&f.cuda_graph, true}}},
      .fields =
          {
              {"--epochs", &f.epochs},
              {"--batch-size", &f.batch_size},
              {"--dropout", &f.dropout},
              {"--model", &f.model},
              {"--device", &f.device},
              {"--limit-train", &f.limit_train},
              {"--eval-batch-size", &f.eval_batch_size},
              {"--data-dir", &f.data_dir},
              {"--amp", &f.amp},
              {"--save", &f.save_path},
              {"--trace", &f.trace_path},
              {"--resume", &f.resume_path},
              {"--stop-after", &f.stop_after},
              {"--workers", &f.workers},
              {"--seed", &f.seed},
              {"--hidden", &f.hidden},
          },
  };
  try {
    mg::examples::parse_command_line(argc, argv, command_line, f.train);
  } catch (const mg::ValueError& e) {
    usage_error(e.what());
  }
  if (f.epochs < 1) usage_error("--epochs must be >= 1");
  if (f.batch_size < 1) usage_error("--batch-size must be >= 1");
  if (f.eval_batch_size < 1) usage_error("--eval-batch-size must be >= 1");
  if (f.limit_train == 0 || f.limit_train < -1) usage_error("--limit-train must be a positive number of images");
  if (!(f.dropout >= 0 && f.dropout < 1)) usage_error("--dropout must be in [0, 1)");
  for (int64_t h : f.hidden)
    if (h < 1) usage_error("--hidden widths must be positive");
  bool known = false;
  std::string valid;
  for (auto& m : kModels) {
    known |= m == f.model;
    valid += (valid.empty() ? "" : ", ") + m;
  }
  if (!known) usage_error("unknown --model \"" + f.model + "\" (valid: " + valid + ")");
  if (f.workers < 0) usage_error("--workers must be >= 0");
  if (f.amp != "off" && f.amp != "f16" && f.amp != "bf16")
    usage_error("unknown --amp \"" + f.amp + "\" (valid: off, f16, bf16)");
  f.train.capturable = f.cuda_graph;
  if (f.train.scheduler.empty()) f.train.scheduler = default_scheduler(f.model);
  try {
    mg::examples::finalize_training_flags(f.train, f.epochs);
  } catch (const mg::ValueError& e) {
    usage_error(e.what());
  }
  return f;
}

std::string optimizer_line(const mg::examples::TrainingFlags& t, const mg::examples::Schedule& schedule) {
  std::ostringstream o;  // default float format (the report prints fixed with 2 decimals)
  o << t.optimizer << " lr " << t.lr;
  if (t.optimizer == "sgd") o << " momentum " << t.momentum;
  o << ", weight decay " << t.weight_decay << ", schedule " << schedule.describe();
  if (t.clip_grad_norm > 0) o << ", clip grad norm " << t.clip_grad_norm;
  return o.str();
}

std::shared_ptr<mg::nn::Sequential> make_mlp(const Flags& f, mg::Device device) {
  auto model = std::make_shared<mg::nn::Sequential>();
  model->push_back(std::make_shared<mg::nn::Flatten>());
  int64_t in = mg::data::FashionMNIST::kImageSize * mg::data::FashionMNIST::kImageSize;
  for (int64_t h : f.hidden) {
    model->push_back(std::make_shared<mg::nn::Linear>(in, h, true, mg::TensorOptions(mg::DType::f32, device)));
    // In place: the Linear output is not needed by backward, so ReLU can overwrite it.
    model->push_back(std::make_shared<mg::nn::ReLU>(/*inplace=*/true));
    if (f.dropout > 0) model->push_back(std::make_shared<mg::nn::Dropout>(f.dropout));
    in = h;
  }
  model->push_back(std::make_shared<mg::nn::Linear>(in, mg::data::FashionMNIST::kNumClasses, true,
                                                    mg::TensorOptions(mg::DType::f32, device)));
  return model;
}

// Conv(1->32, 3x3, pad 1)-BN-ReLU-MaxPool2 -> Conv(32->64)-BN-ReLU-MaxPool2 -> Flatten ->
// Linear(64*7*7, 128)-ReLU[-Dropout] -> Linear(128, 10). The convolutions have no bias:
// the batch norm right after them subtracts any per-channel constant anyway.
std::shared_ptr<mg::nn::Sequential> make_cnn(const Flags& f, mg::Device device) {
  namespace nn = mg::nn;
  const mg::TensorOptions opts(mg::DType::f32, device);
  auto model = std::make_shared<nn::Sequential>();
  int64_t in = 1, side = mg::data::FashionMNIST::kImageSize;
  for (int64_t out : {32, 64}) {
    model->push_back(std::make_shared<nn::Conv2d>(in, out, 3, /*stride=*/1, /*padding=*/1, /*dilation=*/1,
                                                  /*groups=*/1, /*bias=*/false, opts));
    model->push_back(std::make_shared<nn::BatchNorm2d>(out, 1e-5, 0.1, true, true, opts));
    // In place: batch norm's backward needs its input, not its output.
    model->push_back(std::make_shared<nn::ReLU>(/*inplace=*/true));
    model->push_back(std::make_shared<nn::MaxPool2d>(2));
    in = out;
    side /= 2;
  }
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(in * side * side, 128, true, opts));
  model->push_back(std::make_shared<nn::ReLU>(/*inplace=*/true));
  if (f.dropout > 0) model->push_back(std::make_shared<nn::Dropout>(f.dropout));
  model->push_back(std::make_shared<nn::Linear>(128, mg::data::FashionMNIST::kNumClasses, true, opts));
  return model;
}

// Fraction of correctly classified test images.
double evaluate(mg::nn::Module& model, mg::data::DataLoader& loader, mg::Device device) {
  model.eval();
  mg::NoGradGuard no_grad;
  int64_t correct = 0, seen = 0;
  for (auto& batch : loader) {
    mg::MemoryCategoryGuard act(mg::MemoryCategory::Activations);
    mg::Tensor logits = model(batch.data.to(device));
    std::vector<int64_t> pred = mg::kernels::argmax(logits, 1).to_vector<int64_t>();
    std::vector<int64_t> label = batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == label[i];
    seen += static_cast<int64_t>(pred.size());
  }
  return seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0;
}

int run(const Flags& f) {
  const auto t_start = Clock::now();
  const mg::Device device = mg::examples::pick_device(f.device);
  mg::manual_seed(f.seed);

  const std::string root = f.data_dir.empty() ? mg::data::FashionMNIST::default_root() : f.data_dir;
  mg::data::FashionMNISTOptions train_opts;
  train_opts.normalize = true;
  train_opts.limit = f.limit_train;
  mg::data::FashionMNISTOptions test_opts;
  test_opts.normalize = true;
  auto train_set = std::make_shared<mg::data::FashionMNIST>(mg::data::Split::Train, root, train_opts);
  auto test_set = std::make_shared<mg::data::FashionMNIST>(mg::data::Split::Test, root, test_opts);
  const double load_seconds = seconds_since(t_start);

  mg::data::DataLoaderOptions lo;
  lo.batch_size = f.batch_size;
  lo.shuffle = true;
  lo.seed = f.seed;
  lo.num_workers = f.workers;
  if (f.pin_memory) {
    lo.pin_memory = true;
    lo.device = device;
  }
  mg::data::DataLoader train_loader(train_set, lo);
  mg::data::DataLoaderOptions eo;
  eo.batch_size = f.eval_batch_size;
  mg::data::DataLoader test_loader(test_set, eo);

  auto model = f.model == "cnn" ? make_cnn(f, device) : make_mlp(f, device);
  const mg::examples::TrainingFlags& t = f.train;
  std::vector<mg::Tensor> params = model->parameters();
  auto optimizer_ptr = mg::examples::make_optimizer(t, params);
  mg::optim::Optimizer& optimizer = *optimizer_ptr;
  mg::examples::Schedule schedule(t, optimizer, static_cast<int64_t>(train_loader.size()), f.epochs);
  // Mixed precision: autocast around forward + loss; f16 adds dynamic loss scaling.
  const bool amp = f.amp != "off";
  const mg::DType amp_dtype = f.amp == "f16" ? mg::DType::f16 : mg::DType::bf16;
  if (f.amp == "f16" && !device.is_cuda()) throw mg::ValueError("--amp f16 needs a CUDA device (CPU autocast is bf16)");
  mg::optim::GradScalerOptions gso;
  gso.enabled = f.amp == "f16";
  gso.capturable = f.cuda_graph;
  mg::optim::GradScaler scaler(gso);
  mg::serialize::TrainingCheckpoint ckpt;
  ckpt.add("model", *model).add("optimizer", optimizer).add("schedule", schedule).add("scaler", scaler);
  ckpt.add_generator("rng", mg::default_generator());
  int64_t first_epoch = 1;
  if (!f.resume_path.empty()) {
    ckpt.load(f.resume_path, device);
    first_epoch = ckpt.epoch + 1;
    train_loader.set_epoch(ckpt.epoch);  // the shuffle order the uninterrupted run would see next
    std::cout << "resumed from " << f.resume_path << " after epoch " << ckpt.epoch << " (step " << ckpt.step << ")\n";
  }

  std::cout << "fashion_mnist: " << train_set->size() << " train / " << test_set->size() << " test images from " << root
            << " (loaded in " << std::fixed;
  std::cout.precision(2);
  std::cout << load_seconds << " s), device " << device << ", seed " << f.seed << "\nmodel: " << *model << "\n"
            << model->num_parameters() << " parameters; " << optimizer_line(t, schedule) << ", batch size "
            << f.batch_size << "\n";

  // Peaks from here on measure training (the data set itself stays counted under "data").
  mg::CategoryStats::get(device).reset_peak();
  if (!device.is_cpu()) mg::CategoryStats::get(mg::Device::cpu()).reset_peak();

  mg::examples::ProgressBar bar(f.progress);
  double max_grad_norm = 0.0;
  int64_t clipped_steps = 0;
  mg::Tensor grad_norm;  // --cuda-graph: the step's norm, on the device
  auto count_norm = [&](double norm) {
    max_grad_norm = std::max(max_grad_norm, norm);
    clipped_steps += norm > t.clip_grad_norm;
  };
  // One training step: forward + loss under autocast, backward, clipping, optimizer step.
  auto train_step = [&](const mg::Tensor& x, const mg::Tensor& y) {
    mg::Tensor loss;
    {
      mg::MemoryCategoryGuard act(mg::MemoryCategory::Activations);
      mg::Autocast ac(device.type, amp_dtype, amp);
      loss = mg::cross_entropy((*model)(x), y);
    }
    optimizer.zero_grad();
    scaler.scale(loss).backward();  // the engine allocates under MemoryCategory::Gradients itself
    if (t.clip_grad_norm > 0) {
      scaler.unscale_(optimizer);  // clip the true gradients (a no-op without f16 scaling)
      if (f.cuda_graph) {
        grad_norm = mg::optim::clip_grad_norm_on_device_(params, t.clip_grad_norm);  // read after the step
      } else {
        count_norm(mg::optim::clip_grad_norm_(params, t.clip_grad_norm));
      }
    }
    // Momentum buffers / Adam moments: MemoryCategory::OptimizerState. f16: skipped when a
    // gradient overflowed (the scaler then lowers the scale; a capturable one counts on the device).
    scaler.step(optimizer);
    scaler.update();
    return loss;
  };
  if (f.cuda_graph && !device.is_cuda()) throw mg::ValueError("--cuda-graph needs a CUDA device, got " + device.str());
  GraphedStep graphed(train_step);
  const auto t_train = Clock::now();
  double accuracy = 0.0, last_loss = 0.0;
  int64_t images = 0;
  nlohmann::json epochs = nlohmann::json::array();
  for (int64_t epoch = first_epoch; epoch <= f.epochs; ++epoch) {
    model->train();
    const auto t_epoch = Clock::now();
    double loss_sum = 0.0;
    int64_t batches = 0, epoch_images = 0;
    for (auto it = train_loader.begin(); it != train_loader.end(); ++it) {
      mg::Tensor x = it->data.to(device), y = it->target.to(device);
      const bool tracing = !f.trace_path.empty() && epoch == first_epoch && it.batch() == 2;
      if (tracing) mg::profiler::start();
      std::optional<mg::profiler::Range> traced;
      if (tracing) traced.emplace("step", "phase");
      const mg::Tensor loss = f.cuda_graph && x.size(0) == f.batch_size ? graphed.step(x, y) : train_step(x, y);
      if (tracing) {
        if (device.is_cuda()) mg::cuda::synchronize();
        traced.reset();
        mg::profiler::stop();
        mg::profiler::export_chrome_trace(f.trace_path);
        const std::string bad = mg::profiler::validate_chrome_trace(mg::profiler::chrome_trace_json());
        std::cout << "trace of batch 3: " << mg::profiler::event_count() << " events in " << f.trace_path
                  << (bad.empty() ? " (valid)" : " (" + bad + ")") << std::endl;
      }
      schedule.after_batch();
      ++ckpt.step;
      const double l = loss.item();
      if (grad_norm.defined()) count_norm(grad_norm.item());
      loss_sum += l;
      ++batches;
      epoch_images += x.size(0);
      char stats[64];
      std::snprintf(stats, sizeof stats, "loss %.4f  %.0f img/s", loss_sum / batches,
                    epoch_images / std::max(seconds_since(t_epoch), 1e-9));
      bar.update("epoch " + std::to_string(epoch) + "/" + std::to_string(f.epochs), it.batch() + 1, train_loader.size(),
                 stats, it.batch() + 1 == train_loader.size());
    }
    bar.finish();
    const double train_seconds = seconds_since(t_epoch);
    images += epoch_images;
    last_loss = loss_sum / std::max<int64_t>(batches, 1);
    schedule.after_epoch(last_loss);
    {
      mg::Autocast ac(device.type, amp_dtype, amp);
      accuracy = evaluate(*model, test_loader, device);
    }
    if (!f.save_path.empty()) {
      ckpt.epoch = epoch;
      ckpt.save(f.save_path);
    }
    if (epoch == f.stop_after) break;
    const nlohmann::json peaks = peak_bytes(device);
    std::cout << "epoch " << epoch << "/" << f.epochs << ": train loss " << last_loss << ", test accuracy "
              << 100.0 * accuracy << "%, " << train_seconds << " s ("
              << static_cast<int64_t>(epoch_images / train_seconds) << " img/s)\n  peak memory: " << memory_line(peaks)
              << std::endl;
    epochs.push_back({{"epoch", epoch},
                      {"train_loss", last_loss},
                      {"test_accuracy", accuracy},
                      {"train_seconds", train_seconds},
                      {"lr", optimizer.param_groups()[0].lr()}});
  }
  const double train_total = seconds_since(t_train);

  nlohmann::json out = {
      {"test_accuracy", accuracy},
      {"final_train_loss", last_loss},
      {"seconds", seconds_since(t_start)},
      {"train_seconds", train_total},
      {"images_per_second", images / std::max(train_total, 1e-9)},
      {"epochs", f.epochs},
      {"batch_size", f.batch_size},
      {"optimizer", t.optimizer},
      {"lr", t.lr},
      {"scheduler", t.scheduler},
      {"schedule", schedule.describe()},
      {"warmup_steps", t.warmup_steps},
      {"momentum", t.optimizer == "sgd" ? nlohmann::json(t.momentum) : nlohmann::json(nullptr)},
      {"weight_decay", t.weight_decay},
      {"clip_grad_norm", t.clip_grad_norm},
      {"max_grad_norm", t.clip_grad_norm > 0 ? nlohmann::json(max_grad_norm) : nlohmann::json(nullptr)},
      {"clipped_steps", clipped_steps},
      {"workers", f.workers},
      {"amp", f.amp},
      {"cuda_graph", f.cuda_graph},
      {"graph_captures", graphed.captures()},
      {"skipped_steps", scaler.skipped_steps()},
      {"final_loss_scale", f.amp == "f16" ? nlohmann::json(scaler.get_scale()) : nlohmann::json(nullptr)},
      {"seed", f.seed},
      {"model", f.model},
      {"device", device.str()},
      {"train_examples", train_set->size()},
      {"test_examples", test_set->size()},
      {"num_parameters", model->num_parameters()},
      {"peak_bytes", peak_bytes(device)},
      {"at_peak_bytes", at_peak_bytes(device)},
      {"per_epoch", epochs},
  };
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  try {
    return run(flags);
  } catch (const mg::Error& e) {
    std::cerr << "\nfashion_mnist: error: " << e.what() << "\n";
    return 1;
  }
}
