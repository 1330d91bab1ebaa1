// Fashion-MNIST (Zalando; 60000 train / 10000 test 28x28 grey images, 10 classes) loaded
// from its four IDX .gz files into a TensorDataset: images f32 [N, 1, 28, 28], labels i64 [N].
#pragma once

#include <string>

#include "data/dataset.h"

namespace mg::data {

enum class Split { Train, Test };

struct FashionMNISTOptions {
  // Scale to [0, 1], then, when normalize, (x - mean) / std with the training set's statistics.
  bool normalize = false;
  double mean = 0.2860;
  double std = 0.3530;
  // Keep only the first `limit` examples (< 0: all). Quick runs and tests.
  int64_t limit = -1;
};

class FashionMNIST : public TensorDataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kImageSize = 28;

  // $MG_FASHION_MNIST if set, else /usr/share/datasets/fashion-mnist.
  static std::string default_root();
  // True when the root holds the four files (train/t10k x images/labels, .gz or plain).
  static bool available(const std::string& root = default_root());
  // "T-shirt/top", "Trouser", ..., "Ankle boot".
  static const char* class_name(int64_t label);

  // Reads `split` from `root` under MemoryCategory::Data. Missing or malformed files raise
  // mg::IOError naming the file (and the MG_FASHION_MNIST override when it is missing).
  explicit FashionMNIST(Split split, const std::string& root = default_root(), FashionMNISTOptions opts = {});

  const Tensor& images() const { return data(); }
  const Tensor& labels() const { return targets(); }

 private:
  explicit FashionMNIST(Example loaded);
  static Example load(Split split, const std::string& root, const FashionMNISTOptions& opts);
};

}  // namespace mg::data
