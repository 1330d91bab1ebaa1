// The real Fashion-MNIST files when installed (skipped otherwise), and FashionMNIST's
// checks on a small synthetic copy written here.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>

#include "data/fashion_mnist.h"
#include "data/idx.h"

namespace mg::data {
namespace {

TEST(FashionMNIST, LoadsTheInstalledDataSet) {
  const std::string root = FashionMNIST::default_root();
  if (!FashionMNIST::available(root))
    GTEST_SKIP() << "Fashion-MNIST not found in " << root << " (install dataset-fashion-mnist or set MG_FASHION_MNIST)";
  FashionMNIST train(Split::Train, root), test(Split::Test, root);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images().sizes(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(train.images().dtype(), DType::f32);
  EXPECT_EQ(train.labels().dtype(), DType::i64);
  auto px = test.images().to_vector<float>();
  float mn = 1, mx = 0;
  double sum = 0;
  for (float v : px) {
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sum += v;
  }
  EXPECT_EQ(mn, 0.0f);
  EXPECT_EQ(mx, 1.0f);
  EXPECT_NEAR(sum / px.size(), 0.286, 0.01);
  // Balanced classes: 1000 test images each.
  std::vector<int> count(10);
  for (int64_t l : test.labels().to_vector<int64_t>()) ++count[l];
  for (int c : count) EXPECT_EQ(c, 1000);
  EXPECT_STREQ(FashionMNIST::class_name(9), "Ankle boot");

  FashionMNISTOptions o;
  o.normalize = true;
  o.limit = 500;
  FashionMNIST small(Split::Train, root, o);
  EXPECT_EQ(small.size(), 500);
  EXPECT_LT(small.images().to_vector<float>()[0], 0.0f);  // background pixels are below the mean
}

class SyntheticRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("TEST_TMPDIR");
    root_ = std::string(dir ? dir : "/tmp") + "/fmnist_synth";
    ::mkdir(root_.c_str(), 0755);
  }
  void write(const std::string& stem, const Tensor& t) { write_idx(root_ + "/" + stem + ".gz", t); }
  void write_all(int64_t n_train, int64_t n_train_labels, uint8_t label = 3) {
    Tensor img = full({n_train, 28, 28}, 255, {DType::u8});
    write("train-images-idx3-ubyte", img);
    write("train-labels-idx1-ubyte", full({n_train_labels}, label, {DType::u8}));
    write("t10k-images-idx3-ubyte", zeros({2, 28, 28}, {DType::u8}));
    write("t10k-labels-idx1-ubyte", zeros({2}, {DType::u8}));
  }
  std::string root_;
};

TEST_F(SyntheticRoot, LoadsAndScales) {
  write_all(4, 4);
  ASSERT_TRUE(FashionMNIST::available(root_));
  FashionMNIST ds(Split::Train, root_);
  EXPECT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.images().to_vector<float>()[0], 1.0f);
  EXPECT_EQ(ds.labels().to_vector<int64_t>(), (std::vector<int64_t>{3, 3, 3, 3}));
  FashionMNIST test(Split::Test, root_);
  EXPECT_EQ(test.size(), 2);
}

TEST_F(SyntheticRoot, MismatchedCountsAndBadLabels) {
  write_all(4, 5);
  EXPECT_THROW(FashionMNIST(Split::Train, root_), IOError);
  write_all(4, 4, /*label=*/12);
  try {
    FashionMNIST ds(Split::Train, root_);
    FAIL() << "expected IOError";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("label 12"), std::string::npos) << e.what();
  }
}

TEST(FashionMNIST, MissingDirectoryNamesTheOverride) {
  try {
    FashionMNIST ds(Split::Train, "/nonexistent/fmnist");
    FAIL() << "expected IOError";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("MG_FASHION_MNIST"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent/fmnist"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(FashionMNIST::available("/nonexistent/fmnist"));
}

}  // namespace
}  // namespace mg::data
