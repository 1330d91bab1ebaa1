// The main job's optimizer, LR scheduler and clipping flags (--optimizer, --scheduler,
// --warmup-steps, --clip-grad-norm, ...) and the objects they build, kept out of fashion_mnist.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/state_dict.h"

#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace mg::examples {

struct TrainingFlags {
  std::string optimizer = "sgd";                  // sgd | adam | adamw
  double lr = -1;                                 // < 0: the optimizer's default (0.02 for sgd, 1e-3 for adam/adamw)
  double momentum = 0.9;                          // sgd only
  double weight_decay = -1;                       // < 0: 0 for sgd/adam, 0.01 for adamw
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam/adamw
  std::string scheduler;            // none | step | multistep | exponential | cosine | plateau; empty: model default
  int64_t warmup_steps = 0;         // linear warmup from lr/100 over this many batches
  int64_t step_size = 1;            // step: epochs between decays
  std::vector<int64_t> milestones;  // multistep: epochs (default: half and three quarters of --epochs)
  double gamma = -1;                // decay factor (< 0: 0.1 for step/multistep/plateau, 0.9 for exponential)
  int64_t patience = 0;             // plateau: epochs without improvement of the training loss
  double clip_grad_norm = 0;        // > 0: clip the gradients' total 2-norm to this
  bool capturable = false;          // not a flag: --cuda-graph's optimizers keep lr and steps on the device
};

extern const char* kTrainingUsage;

// "3.5" -> 3.5 and "12" -> 12 for flag `flag`; anything else is an mg::ValueError naming the flag.
double parse_number(const std::string& flag, const std::string& v);
int64_t parse_integer(const std::string& flag, const std::string& v);

// "2,5,9" -> {2, 5, 9} for flag `flag` (each as parse_integer reads it).
std::vector<int64_t> parse_integer_list(const std::string& flag, const std::string& v);

// Flags that each set one field, the value parsed as the field's type (parse_integer for the
// integers, parse_number, parse_integer_list, or the text as it is).
using FieldFlags =
    std::map<std::string, std::variant<int*, int64_t*, uint64_t*, double*, std::string*, std::vector<int64_t>*>>;

// Sets the field `flag` names from `value`; false when `flag` names none.
bool set_field(const FieldFlags& fields, const std::string& flag, const std::string& value);

// A program's flags, for parse_command_line.
struct CommandLine {
  std::string usage;  // --help and -h print it and exit
  // Flags without a value: the field each sets and the value it sets it to.
  std::map<std::string, std::pair<bool*, bool>> switches;
  FieldFlags fields;
  // Every other flag, with its value; false for a flag the program does not know.
  std::function<bool(const std::string& flag, const std::string& value)> other;
};

// Parses argv[1..] ("--flag value" or "--flag=value") into cl's fields and the training flags; an
// unknown flag, a missing value or a bad one is an mg::ValueError naming the flag.
void parse_command_line(int argc, char** argv, const CommandLine& cl, TrainingFlags& train);

// Consumes `arg value` when it is one of the flags above; false otherwise.
// Bad values throw mg::ValueError naming the flag.
bool parse_training_flag(TrainingFlags& f, const std::string& arg, const std::string& value);
// Fills in the defaults and checks combinations; `epochs` for the multistep default.
void finalize_training_flags(TrainingFlags& f, int64_t epochs);

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainingFlags& f, std::vector<Tensor> params);

// The schedule: every scheduler steps per batch (epoch-based ones are converted with
// steps_per_epoch so their values at epoch boundaries are PyTorch's per-epoch values), except
// plateau, which looks at each epoch's mean training loss.
class Schedule {
 public:
  Schedule(const TrainingFlags& f, optim::Optimizer& opt, int64_t steps_per_epoch, int64_t epochs);
  void after_batch();  // after optimizer.step()
  void after_epoch(double train_loss);
  std::string describe() const { return description_; }
  // Every scheduler's state plus the step count, for --save/--resume.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

 private:
  std::shared_ptr<optim::LRScheduler> per_step_;
  std::shared_ptr<optim::LRScheduler> warmup_only_;  // warmup in front of plateau
  std::unique_ptr<optim::ReduceLROnPlateau> plateau_;
  int64_t warmup_steps_ = 0, step_ = 0;
  std::string description_;
};

}  // namespace mg::examples
