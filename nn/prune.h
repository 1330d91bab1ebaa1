// Pruning (torch.nn.utils.prune): zero weights through a mask kept beside them, by L1 magnitude,
// at random, or globally over several layers; remove() bakes the mask in; sparsity() reports it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "nn/module.h"

// Like PyTorch's reparametrization: pruning parameter `name` of a module moves the trained
// leaf to `name_orig` (same tensor, so an optimizer holding it keeps working), adds the buffer
// `name_mask` (1 = keep, same dtype and device), and turns `name` into a derived slot that a
// forward pre-hook recomputes as name_orig * name_mask before every call. The product puts the
// mask in the forward pass and, through mul's backward, in the gradient of name_orig (pruned
// entries get exactly 0). state_dict() then holds name_orig and name_mask, as PyTorch's does.
namespace mg::nn::prune {

// How much to prune, of the entries not pruned yet (repeated pruning compounds, as in PyTorch).
class Amount {
 public:
  // A fraction in [0, 1]: round-half-to-even(fraction * remaining) entries.
  static Amount fraction(double f);
  // An absolute number of entries (>= 0; more than remain is an error when applied).
  static Amount count(int64_t n);
  // Entries to prune out of `remaining`; mg::ValueError naming `op` when out of range.
  int64_t resolve(int64_t remaining, const std::string& op) const;
  std::string str() const;

 private:
  Amount(bool is_fraction, double f, int64_t n) : is_fraction_(is_fraction), fraction_(f), count_(n) {}
  bool is_fraction_;
  double fraction_;
  int64_t count_;
};

// Prunes the `amount` remaining entries of smallest |value| (ties: lower flat index first).
void l1_unstructured(Module& module, const std::string& name, Amount amount);
// Prunes `amount` remaining entries chosen uniformly at random (`gen` null: default generator).
void random_unstructured(Module& module, const std::string& name, Amount amount, Generator* gen = nullptr);

enum class Method { L1Unstructured, RandomUnstructured };
// Ranks the remaining entries of all listed parameters together and prunes `amount` of their
// total (so layers with small weights lose more of them). Each (module, name) is pruned as above.
void global_unstructured(const std::vector<std::pair<Module*, std::string>>& params, Method method, Amount amount,
                         Generator* gen = nullptr);
// Applies a given mask (same shape as the parameter; nonzero = keep), combined with any previous one.
void custom_from_mask(Module& module, const std::string& name, const Tensor& mask);

// Whether `name` of `module` is currently pruned (has name_orig and name_mask).
bool is_pruned(const Module& module, const std::string& name);
// Makes the pruning permanent: name_orig *= name_mask in place, then the same tensor becomes
// `name` again (identity kept) and name_orig, name_mask and the hook go away.
void remove(Module& module, const std::string& name);

struct SparsityEntry {
  std::string name;  // dotted; a pruned parameter is listed under its own name (not name_orig)
  int64_t numel = 0;
  int64_t zeros = 0;
  double sparsity() const { return numel ? static_cast<double>(zeros) / static_cast<double>(numel) : 0.0; }
};
struct SparsityReport {
  std::vector<SparsityEntry> entries;
  int64_t numel = 0;
  int64_t zeros = 0;
  double sparsity() const { return numel ? static_cast<double>(zeros) / static_cast<double>(numel) : 0.0; }
  // One line per parameter ("fc1.weight   zeros 40140 / 200704 ( 20.00%)") and a total.
  std::string str() const;
};
// Zero entries of every parameter of `module` (pruned ones by their effective value).
SparsityReport sparsity(const Module& module);
// Fraction of exactly-zero entries of `t`.
double sparsity(const Tensor& t);

}  // namespace mg::nn::prune
