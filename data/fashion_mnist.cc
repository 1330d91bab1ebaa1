#include "data/fashion_mnist.h"

#include <sys/stat.h>

#include <cstdlib>

#include "core/env.h"
#include "data/idx.h"

namespace mg::data {

namespace {
constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// root/stem.gz, else root/stem; empty when neither exists.
std::string find_file(const std::string& root, const std::string& stem) {
  for (const std::string& p : {root + "/" + stem + ".gz", root + "/" + stem})
    if (exists(p)) return p;
  return "";
}

std::string require_file(const std::string& root, const std::string& stem) {
  std::string p = find_file(root, stem);
  MG_CHECK(!p.empty(), IOError, "FashionMNIST: ", root, "/", stem,
           "(.gz) not found; point MG_FASHION_MNIST at the "
           "directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz "
           "and t10k-labels-idx1-ubyte.gz");
  return p;
}

const char* stem(Split s, bool images) {
  if (s == Split::Train) return images ? "train-images-idx3-ubyte" : "train-labels-idx1-ubyte";
  return images ? "t10k-images-idx3-ubyte" : "t10k-labels-idx1-ubyte";
}
}  // namespace

std::string FashionMNIST::default_root() {
  const char* root = env::get("MG_FASHION_MNIST");
  return root ? std::string(root) : std::string(kDefaultRoot);
}

bool FashionMNIST::available(const std::string& root) {
  for (Split s : {Split::Train, Split::Test})
    for (bool images : {true, false})
      if (find_file(root, stem(s, images)).empty()) return false;
  return true;
}

const char* FashionMNIST::class_name(int64_t label) {
  static const char* names[kNumClasses] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                           "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  MG_CHECK(label >= 0 && label < kNumClasses, IndexError, "FashionMNIST::class_name: label ", label,
           " out of range [0, 10)");
  return names[label];
}

FashionMNIST::FashionMNIST(Split split, const std::string& root, FashionMNISTOptions opts)
    : FashionMNIST(load(split, root, opts)) {}

FashionMNIST::FashionMNIST(Example loaded) : TensorDataset(std::move(loaded.data), std::move(loaded.target)) {}

Example FashionMNIST::load(Split split, const std::string& root, const FashionMNISTOptions& opts) {
  MG_CHECK(opts.std > 0, ValueError, "FashionMNIST: std must be > 0, got ", opts.std);
  MemoryCategoryGuard g(MemoryCategory::Data);
  const std::string img_path = require_file(root, stem(split, true));
  const std::string lbl_path = require_file(root, stem(split, false));
  Tensor img = read_idx(img_path);
  Tensor lbl = read_idx(lbl_path);
  MG_CHECK(img.dtype() == DType::u8 && img.dim() == 3 && img.size(1) == kImageSize && img.size(2) == kImageSize,
           IOError, "FashionMNIST: ", img_path, ": expected u8 images of shape [N, 28, 28], got ", img.dtype(), " ",
           shape_str(img.sizes()));
  MG_CHECK(lbl.dtype() == DType::u8 && lbl.dim() == 1, IOError, "FashionMNIST: ", lbl_path,
           ": expected u8 labels of shape [N], got ", lbl.dtype(), " ", shape_str(lbl.sizes()));
  MG_CHECK(img.size(0) == lbl.size(0), IOError, "FashionMNIST: ", img_path, " has ", img.size(0), " images but ",
           lbl_path, " has ", lbl.size(0), " labels");
  int64_t n = img.size(0);
  if (opts.limit >= 0 && opts.limit < n) n = opts.limit;

  const int64_t pix = kImageSize * kImageSize;
  Tensor images = empty({n, 1, kImageSize, kImageSize}, {DType::f32, Device::cpu()});
  Tensor labels = empty({n}, {DType::i64, Device::cpu()});
  const uint8_t* src = img.data_ptr<uint8_t>();
  float* dst = images.data_ptr<float>();
  // x / 255 then (x - mean) / std folded into one multiply-add per pixel.
  const double scale = opts.normalize ? 1.0 / (255.0 * opts.std) : 1.0 / 255.0;
  const double shift = opts.normalize ? -opts.mean / opts.std : 0.0;
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(v * scale + shift);
  for (int64_t i = 0; i < n * pix; ++i) dst[i] = lut[src[i]];
  const uint8_t* ls = lbl.data_ptr<uint8_t>();
  int64_t* ld = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    MG_CHECK(ls[i] < kNumClasses, IOError, "FashionMNIST: ", lbl_path, ": label ", int{ls[i]}, " at index ", i,
             " is outside [0, 10)");
    ld[i] = ls[i];
  }
  return {images, labels};
}

}  // namespace mg::data
