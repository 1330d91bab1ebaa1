#include "examples/training_setup.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <type_traits>

#include "optim/adam.h"
#include "optim/sgd.h"

namespace mg::examples {

const char* kTrainingUsage = R"(  --optimizer NAME    sgd (default), adam, adamw or adamw8bit (AdamW with 8-bit moments)
  --lr X              learning rate (default 0.02 for sgd, 0.001 for adam/adamw)
  --momentum X        SGD momentum (default 0.9)
  --weight-decay X    sgd/adam: L2 penalty added to the gradient; adamw: decoupled decay
                      (default 0, adamw 0.01)
  --beta1 X, --beta2 X, --eps X   Adam/AdamW moments (default 0.9, 0.999, 1e-8)
  --scheduler S       none, step, multistep, exponential, cosine or plateau (default: cosine
                      for cnn, none for mlp). cosine anneals to 0 over all batches; step,
                      multistep and exponential decay per epoch (applied per batch, equal to
                      the per-epoch value at each epoch start); plateau multiplies the lr by
                      --gamma when the epoch's training loss stops improving
  --lr-schedule S     older spelling: constant (= none) or cosine
  --warmup-steps N    linear warmup from lr/100 to lr over the first N batches (default 0)
  --step-size N       step: epochs between decays (default 1)
  --milestones A,B    multistep: epochs where the lr decays (default: 1/2 and 3/4 of --epochs)
  --gamma X           decay factor (default 0.1; exponential 0.9)
  --patience N        plateau: epochs without improvement before a decay (default 0)
  --clip-grad-norm X  clip the gradients' total 2-norm to X before each step (default off)
)";

double parse_number(const std::string& flag, const std::string& v) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  MG_CHECK(pos == v.size() && pos > 0, ValueError, flag, " expects a number, got \"", v, "\"");
  return x;
}
int64_t parse_integer(const std::string& flag, const std::string& v) {
  const double x = parse_number(flag, v);
  MG_CHECK(x == std::floor(x), ValueError, flag, " expects an integer, got \"", v, "\"");
  return static_cast<int64_t>(x);
}

std::vector<int64_t> parse_integer_list(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream ss(v);
  for (std::string tok; std::getline(ss, tok, ',');) out.push_back(parse_integer(flag, tok));
  return out;
}

bool set_field(const FieldFlags& fields, const std::string& flag, const std::string& value) {
  auto it = fields.find(flag);
  if (it == fields.end()) return false;
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::string>)
          *field = value;
        else if constexpr (std::is_same_v<T, double>)
          *field = parse_number(flag, value);
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          *field = parse_integer_list(flag, value);
        else
          *field = static_cast<T>(parse_integer(flag, value));
      },
      it->second);
  return true;
}

void parse_command_line(int argc, char** argv, const CommandLine& cl, TrainingFlags& train) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      std::cout << cl.usage;
      std::exit(0);
    }
    if (auto sw = cl.switches.find(flag); sw != cl.switches.end()) {
      *sw->second.first = sw->second.second;
      continue;
    }
    MG_CHECK(flag.rfind("--", 0) == 0, ValueError, "unexpected argument \"", flag, "\"");
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else {
      MG_CHECK(i + 1 < argc, ValueError, flag, " needs a value");
      value = argv[++i];
    }
    const bool known = set_field(cl.fields, flag, value) || parse_training_flag(train, flag, value) ||
                       (cl.other && cl.other(flag, value));
    MG_CHECK(known, ValueError, "unknown flag ", flag);
  }
}

bool parse_training_flag(TrainingFlags& f, const std::string& arg, const std::string& v) {
  const FieldFlags fields = {
      {"--optimizer", &f.optimizer},
      {"--lr", &f.lr},
      {"--momentum", &f.momentum},
      {"--weight-decay", &f.weight_decay},
      {"--beta1", &f.beta1},
      {"--beta2", &f.beta2},
      {"--eps", &f.eps},
      {"--scheduler", &f.scheduler},
      {"--warmup-steps", &f.warmup_steps},
      {"--step-size", &f.step_size},
      {"--gamma", &f.gamma},
      {"--patience", &f.patience},
      {"--milestones", &f.milestones},
      {"--clip-grad-norm", &f.clip_grad_norm},
  };
  if (set_field(fields, arg, v)) return true;
  if (arg != "--lr-schedule") return false;
  MG_CHECK(v == "constant" || v == "cosine", ValueError, "unknown --lr-schedule \"", v, "\" (valid: constant, cosine)");
  f.scheduler = v == "constant" ? "none" : v;
  return true;
}

void finalize_training_flags(TrainingFlags& f, int64_t epochs) {
  MG_CHECK(f.optimizer == "sgd" || f.optimizer == "adam" || f.optimizer == "adamw" || f.optimizer == "adamw8bit",
           ValueError, "unknown --optimizer \"", f.optimizer, "\" (valid: sgd, adam, adamw, adamw8bit)");
  const std::vector<std::string> kinds = {"none", "step", "multistep", "exponential", "cosine", "plateau"};
  bool known = false;
  for (auto& k : kinds) known |= k == f.scheduler;
  MG_CHECK(known, ValueError, "unknown --scheduler \"", f.scheduler,
           "\" (valid: none, step, multistep, exponential, cosine, plateau)");
  if (f.lr < 0) f.lr = f.optimizer == "sgd" ? 0.02 : 1e-3;
  if (f.weight_decay < 0) f.weight_decay = f.optimizer == "adamw" || f.optimizer == "adamw8bit" ? 0.01 : 0.0;
  if (f.gamma < 0) f.gamma = f.scheduler == "exponential" ? 0.9 : 0.1;
  if (f.milestones.empty()) f.milestones = {std::max<int64_t>(1, epochs / 2), std::max<int64_t>(1, 3 * epochs / 4)};
  MG_CHECK(f.warmup_steps >= 0, ValueError, "--warmup-steps must be >= 0, got ", f.warmup_steps);
  MG_CHECK(f.clip_grad_norm >= 0, ValueError, "--clip-grad-norm must be >= 0, got ", f.clip_grad_norm);
  MG_CHECK(f.patience >= 0, ValueError, "--patience must be >= 0, got ", f.patience);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainingFlags& f, std::vector<Tensor> params) {
  if (f.optimizer == "sgd") {
    optim::SGDOptions o;
    o.lr = f.lr;
    o.momentum = f.momentum;
    o.weight_decay = f.weight_decay;
    o.capturable = f.capturable;
    return std::make_unique<optim::SGD>(std::move(params), o);
  }
  optim::AdamWOptions o;
  o.lr = f.lr;
  o.beta1 = f.beta1;
  o.beta2 = f.beta2;
  o.eps = f.eps;
  o.weight_decay = f.weight_decay;
  o.capturable = f.capturable;
  if (f.optimizer == "adamw") return std::make_unique<optim::AdamW>(std::move(params), o);
  if (f.optimizer == "adamw8bit") {
    optim::AdamW8bitOptions q;
    static_cast<optim::AdamWOptions&>(q) = o;
    q.state_bits = 8;
    return std::make_unique<optim::AdamW8bit>(std::move(params), q);
  }
  return std::make_unique<optim::Adam>(std::move(params), static_cast<const optim::AdamOptions&>(o));
}

Schedule::Schedule(const TrainingFlags& f, optim::Optimizer& opt, int64_t spe, int64_t epochs)
    : warmup_steps_(f.warmup_steps) {
  using namespace optim;
  std::ostringstream d;
  const int64_t total = spe * epochs;
  std::shared_ptr<LRScheduler> main;
  std::shared_ptr<LRScheduler> warm;
  if (f.warmup_steps > 0) warm = std::make_shared<LinearLR>(opt, 0.01, 1.0, f.warmup_steps);
  const int64_t after_warmup = std::max<int64_t>(1, total - f.warmup_steps);
  if (f.scheduler == "step") {
    main = std::make_shared<StepLR>(opt, f.step_size * spe, f.gamma);
    d << "StepLR(every " << f.step_size << " epochs, gamma " << f.gamma << ")";
  } else if (f.scheduler == "multistep") {
    std::vector<int64_t> m;
    for (int64_t e : f.milestones) m.push_back(e * spe);
    main = std::make_shared<MultiStepLR>(opt, m, f.gamma);
    d << "MultiStepLR(epochs";
    for (int64_t e : f.milestones) d << " " << e;
    d << ", gamma " << f.gamma << ")";
  } else if (f.scheduler == "exponential") {
    main = std::make_shared<ExponentialLR>(opt, std::pow(f.gamma, 1.0 / static_cast<double>(spe)));
    d << "ExponentialLR(gamma " << f.gamma << " per epoch)";
  } else if (f.scheduler == "cosine") {
    main = std::make_shared<CosineAnnealingLR>(opt, after_warmup);
    d << "CosineAnnealingLR(T_max " << after_warmup << " batches)";
  } else if (f.scheduler == "plateau") {
    PlateauOptions p;
    p.factor = f.gamma;
    p.patience = f.patience;
    plateau_ = std::make_unique<ReduceLROnPlateau>(opt, p);
    d << "ReduceLROnPlateau(train loss, factor " << f.gamma << ", patience " << f.patience << ")";
  } else {
    d << "constant";
  }
  if (warm && main) {
    per_step_ = std::make_shared<SequentialLR>(opt, std::vector<std::shared_ptr<LRScheduler>>{warm, main},
                                               std::vector<int64_t>{f.warmup_steps});
  } else if (warm) {
    // Alone (or before plateau) the warmup is stepped only while it lasts, so it never
    // overwrites what the plateau scheduler decided.
    warmup_only_ = warm;
  } else {
    per_step_ = main;
  }
  if (warm) d << " after " << f.warmup_steps << " warmup batches";
  description_ = d.str();
}

void Schedule::after_batch() {
  ++step_;
  if (per_step_) per_step_->step();
  if (warmup_only_ && step_ <= warmup_steps_) warmup_only_->step();
}

void Schedule::after_epoch(double train_loss) {
  if (plateau_) plateau_->step(train_loss);
}

StateDict Schedule::state_dict() const {
  StateDict sd;
  sd.meta["step"] = step_;
  if (per_step_) sd.merge("per_step", per_step_->state_dict());
  if (warmup_only_) sd.merge("warmup", warmup_only_->state_dict());
  if (plateau_) sd.merge("plateau", plateau_->state_dict());
  return sd;
}

void Schedule::load_state_dict(const StateDict& sd) {
  MG_CHECK(sd.meta.contains("step"), ValueError,
           "schedule: the checkpoint has no schedule step (saved with other flags?)");
  const std::pair<const char*, bool> parts[] = {
      {"per_step", per_step_ != nullptr}, {"warmup", warmup_only_ != nullptr}, {"plateau", plateau_ != nullptr}};
  for (const auto& [part, mine] : parts)
    MG_CHECK(mine == sd.meta.contains(part), ValueError, "schedule: the checkpoint's scheduler (", part,
             mine ? " missing" : " present", ") does not match this run's --scheduler/--warmup-steps flags");
  if (per_step_) per_step_->load_state_dict(sd.sub("per_step"));
  if (warmup_only_) warmup_only_->load_state_dict(sd.sub("warmup"));
  if (plateau_) plateau_->load_state_dict(sd.sub("plateau"));
  step_ = sd.meta["step"].get<int64_t>();
}

}  // namespace mg::examples
