// safetensors save/load: round trips of every dtype, the byte layout, files written by hand as
// another writer would, each kind of damage as a clear IOError, atomic replacement (mode 0644,
// umask untouched), and Module::state_dict / load_state_dict. The randomized damage is
// safetensors_fuzz_test's.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/device_runtime.h"
#include "nn/nn.h"
#include "serialize/serialize.h"
#include "tests/serialize/all_dtypes.h"

namespace mg::nn {

using namespace mg::serialize;  // the module under test
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string temp_dir() {
  const char* t = std::getenv("TEST_TMPDIR");
  fs::path d = fs::path(t ? t : "/tmp") / ("serialize_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d.string();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string bytes_of(const Tensor& t) {
  Tensor c = raw::contiguous(t.is_cuda() ? raw::to_device(t, Device::cpu()) : t);
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

void expect_same(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (auto& [k, t] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(k)) << k;
    const Tensor& u = b.tensors.at(k);
    EXPECT_EQ(u.dtype(), t.dtype()) << k;
    EXPECT_EQ(u.sizes(), t.sizes()) << k;
    EXPECT_EQ(bytes_of(u), bytes_of(t)) << k;
  }
  EXPECT_EQ(a.meta, b.meta);
}

TEST(Safetensors, RoundTripsEveryDtypeThroughAFile) {
  const std::string path = temp_dir() + "/all.safetensors";
  StateDict sd = all_dtypes();
  save(sd, path);
  StateDict back = load(path);
  expect_same(sd, back);
  for (auto& [k, t] : back.tensors) EXPECT_TRUE(t.is_contiguous() && t.device().is_cpu()) << k;
  // In memory too, and the bytes are the file's.
  EXPECT_EQ(save_to_bytes(sd), read_file(path));
  expect_same(sd, load_from_bytes(save_to_bytes(sd)));
}

TEST(Safetensors, ByteLayoutFollowsTheFormat) {
  StateDict sd;
  sd.tensors["b"] = from_vector(std::vector<float>{1, 2, 3}, {3});
  sd.tensors["a"] = from_vector(std::vector<int64_t>{7, -8}, {1, 2});
  sd.meta = {{"step", 4}};
  const std::string bytes = save_to_bytes(sd);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // the data starts 8-byte aligned
  json h = json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["a"]["dtype"], "I64");
  EXPECT_EQ(h["a"]["shape"], json({1, 2}));
  EXPECT_EQ(h["b"]["dtype"], "F32");
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(json::parse(h["__metadata__"]["memgrad.meta"].get<std::string>()), sd.meta);
  const uint64_t b0 = h["b"]["data_offsets"][0], b1 = h["b"]["data_offsets"][1];
  ASSERT_EQ(b1 - b0, 12u);
  float f[3];
  std::memcpy(f, bytes.data() + 8 + n + b0, 12);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[2], 3.0f);
  EXPECT_EQ(bytes.size(), 8 + n + 12 + 16);

  // Every tensor starts aligned to its element size (widest dtypes first, no padding).
  StateDict mixed = all_dtypes();
  const std::string mb = save_to_bytes(mixed);
  uint64_t mn;
  std::memcpy(&mn, mb.data(), 8);
  json mh = json::parse(mb.substr(8, mn));
  for (auto& [k, t] : mixed.tensors) {
    const uint64_t begin = mh[k]["data_offsets"][0];
    EXPECT_EQ(begin % t.element_size(), 0u) << k << " starts at " << begin;
  }
}

// Builds a file the way another writer might: any key order, no padding, optional metadata.
std::string make_file(const json& header, const std::string& data) {
  const std::string text = header.dump();
  uint64_t n = text.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + text + data;
}

TEST(Safetensors, ReadsAFileWrittenByAnotherWriter) {
  std::string data(4 * 4 + 2 * 2, '\0');
  const float f[4] = {1.5f, -2.f, 0.25f, 8.f};
  const uint16_t bf[2] = {BFloat16(3.0f).x, BFloat16(-0.5f).x};
  std::memcpy(data.data(), bf, 4);  // "z" first in the data, though it sorts last
  std::memcpy(data.data() + 4, f, 16);
  json h = {{"z", {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {0, 4}}}},
            {"m", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {4, 20}}}}};
  StateDict sd = load_from_bytes(make_file(h, data));
  EXPECT_EQ(sd.tensors.at("m").to_vector<float>(), (std::vector<float>{1.5f, -2.f, 0.25f, 8.f}));
  EXPECT_EQ(sd.tensors.at("z").to_vector<float>(), (std::vector<float>{3.0f, -0.5f}));
  EXPECT_TRUE(sd.meta.is_object() && sd.meta.empty());
}

// Each damage is an IOError whose message names the source and (where there is one) the key.
TEST(Safetensors, DamagedFilesAreClearErrors) {
  const std::string data(16, '\0');
  auto entry = [](const char* dt, json shape, uint64_t b, uint64_t e) {
    return json{{"dtype", dt}, {"shape", shape}, {"data_offsets", {b, e}}};
  };
  const std::string good = make_file({{"w", entry("F32", {2, 2}, 0, 16)}}, data);
  ASSERT_NO_THROW(load_from_bytes(good, Device::cpu(), "good.st"));
  auto header_len = [](uint64_t n, const std::string& rest) {
    return std::string(reinterpret_cast<const char*>(&n), 8) + rest;
  };
  auto raw_header = [&](const std::string& text) { return header_len(text.size(), text); };
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;  // a piece of the message
  };
  const std::vector<Case> cases = {
      {"empty file", "", "truncated"},
      {"short length", std::string(5, '\0'), "truncated"},
      {"length past end", header_len(1000, "{}"), "runs past the end"},
      {"bad json", raw_header("{\"a\":"), "not valid JSON"},
      {"not an object", make_file(json::array({1, 2}), ""), "must be a JSON object"},
      {"unknown dtype", make_file({{"w", entry("F8_E4M3", {16}, 0, 16)}}, data), "\"w\": unsupported dtype"},
      {"size mismatch", make_file({{"w", entry("F32", {2, 3}, 0, 16)}}, data), "\"w\": dtype F32 shape [2,3] needs 24"},
      {"overlap", make_file({{"a", entry("F32", {3}, 0, 12)}, {"b", entry("F32", {1}, 8, 12)}}, data), "overlap"},
      {"out of range", make_file({{"w", entry("F32", {8}, 0, 32)}}, data), "\"w\": data_offsets [0, 32] run past"},
      {"gap", make_file({{"w", entry("F32", {2}, 8, 16)}}, data), "gap"},
      {"trailing bytes", make_file({{"w", entry("F32", {2}, 0, 8)}}, data), "trailing"},
      {"end before begin", make_file({{"w", entry("F32", {0}, 9, 8)}}, data), "end before"},
      {"negative dim", make_file({{"w", {{"dtype", "F32"}, {"shape", {-4}}, {"data_offsets", {0, 16}}}}}, data),
       "non-negative"},
      {"missing field", make_file({{"w", {{"dtype", "F32"}, {"shape", {4}}}}}, data), "needs dtype, shape"},
      {"unknown field",
       make_file({{"w", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}, {"x", 1}}}}, data),
       "unknown field"},
      {"duplicate key",
       raw_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[4]}})"),
       "duplicate key \"w\""},
      {"metadata not strings", make_file({{"__metadata__", {{"k", 1}}}}, ""), "__metadata__[\"k\"]"},
      {"meta not json", make_file({{"__metadata__", {{"memgrad.meta", "{oops"}}}}, ""), "memgrad.meta"},
      {"bool byte", make_file({{"m", entry("BOOL", {2}, 0, 2)}}, std::string("\x01\x07", 2)), "BOOL element 1"},
      {"huge shape", make_file({{"w", entry("F32", {1ull << 40, 1ull << 40, 0}, 0, 0)}}, ""), "too large"},
      {"numel overflow", make_file({{"w", entry("F64", {1ull << 62, 4}, 0, 16)}}, data), "\"w\""},
  };
  for (const Case& c : cases) {
    try {
      load_from_bytes(c.bytes, Device::cpu(), "ckpt.st");
      ADD_FAILURE() << c.what << ": loaded without error";
    } catch (const IOError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ckpt.st"), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    }
  }
}

TEST(Safetensors, FilesThatAreNotThereOrNotFiles) {
  const std::string dir = temp_dir();
  EXPECT_THROW(load(dir + "/missing.safetensors"), IOError);
  EXPECT_THROW(load(dir), IOError);  // a directory
  StateDict sd = all_dtypes();
  EXPECT_THROW(save(sd, dir + "/no/such/dir/x.safetensors"), IOError);
  StateDict bad;
  bad.tensors["x"] = Tensor();
  EXPECT_THROW(save(bad, dir + "/bad.safetensors"), ValueError);
  bad.tensors.clear();
  bad.tensors["__metadata__"] = zeros({1});
  EXPECT_THROW(save(bad, dir + "/bad.safetensors"), ValueError);
  EXPECT_FALSE(fs::exists(dir + "/bad.safetensors"));
}

std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

TEST(AtomicWrite, AFailedWriteLeavesThePreviousFileIntact) {
  const std::string dir = temp_dir() + "/atomic";
  fs::create_directories(dir);
  const std::string path = dir + "/model.safetensors";
  StateDict first = all_dtypes();
  save(first, path);
  const std::string before = read_file(path);

  // The producer fails half way.
  EXPECT_THROW(write_file_atomically(path,
                                     [](const ByteSink& sink) {
                                       sink("partial", 7);
                                       MG_THROW(ValueError, "producer gave up");
                                     }),
               ValueError);
  EXPECT_EQ(read_file(path), before);
  EXPECT_TRUE(leftovers(dir).empty());

  // The file system refuses the bytes (the file-size limit stands in for a full disk).
  StateDict big;
  big.tensors["w"] = randn({64, 1024});
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool io_error = false;
  try {
    save(big, path);
  } catch (const IOError& e) {
    io_error = true;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev);
  EXPECT_TRUE(io_error);
  EXPECT_EQ(read_file(path), before);
  EXPECT_TRUE(leftovers(dir).empty());
  expect_same(first, load(path));

  // A successful save replaces it whole.
  save(big, path);
  expect_same(big, load(path));
  EXPECT_TRUE(leftovers(dir).empty());
}

// The file mode is 0644 whatever the umask, set with fchmod: the process umask is neither read
// nor changed (it is process-wide, so a save that set it to 0 even briefly made files other
// threads created meanwhile world-writable). The first version did umask(0) / umask(mask) and
// gave 0666 & ~umask: 0600 under umask 077, 0666 under umask 0.
TEST(AtomicWrite, ModeIs0644AndTheUmaskIsUntouched) {
  const std::string path = temp_dir() + "/mode.safetensors";
  const mode_t saved = ::umask(022);
  for (mode_t mask : {mode_t{077}, mode_t{0}, mode_t{027}}) {
    ::umask(mask);
    save(all_dtypes(), path);
    EXPECT_EQ(::umask(mask), mask) << "save changed the umask";
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0644u) << "umask " << std::oct << mask;
  }
  ::umask(saved);
}

// A small model with parameters and BatchNorm buffers (running stats, an i64 counter).
std::shared_ptr<Sequential> make_cnn() {
  return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(2, 4, 3, 1, 1), std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>(),
      std::make_shared<Flatten>(), std::make_shared<Linear>(4 * 5 * 5, 3)});
}

TEST(StateDictModule, SaveLoadRestoresParametersAndBuffers) {
  auto a = make_cnn();
  Tensor x = randn({6, 2, 5, 5});
  a->train();
  a->forward(x);  // updates the running stats
  const std::string path = temp_dir() + "/cnn.safetensors";
  StateDict sd = a->state_dict();
  EXPECT_TRUE(sd.tensors.count("1.running_mean") && sd.tensors.count("1.num_batches_tracked"));
  EXPECT_EQ(sd.tensors.at("1.num_batches_tracked").dtype(), DType::i64);
  save(sd, path);

  auto b = make_cnn();
  std::vector<Tensor> handles = b->parameters();
  LoadStateDictResult r = b->load_state_dict(load(path));
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  for (size_t i = 0; i < handles.size(); ++i) EXPECT_TRUE(handles[i].is_same(b->parameters()[i]));  // identity kept
  expect_same(a->state_dict(), b->state_dict());
  a->eval();
  b->eval();
  NoGradGuard ng;
  EXPECT_EQ(a->forward(x).to_vector<float>(), b->forward(x).to_vector<float>());
}

TEST(StateDictModule, StrictAndNonStrictKeyChecks) {
  auto a = make_cnn();
  StateDict sd = a->state_dict();
  sd.tensors.erase("4.bias");
  sd.tensors["extra.weight"] = zeros({1});
  auto b = make_cnn();
  const std::vector<float> before = b->state_dict().tensors.at("0.weight").to_vector<float>();
  try {
    b->load_state_dict(sd);
    ADD_FAILURE() << "strict load accepted missing and unexpected keys";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("\"4.bias\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"extra.weight\""), std::string::npos) << msg;
  }
  EXPECT_EQ(b->state_dict().tensors.at("0.weight").to_vector<float>(), before);  // untouched
  LoadStateDictResult r = b->load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"4.bias"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"extra.weight"}));
  EXPECT_EQ(b->state_dict().tensors.at("0.weight").to_vector<float>(),
            a->state_dict().tensors.at("0.weight").to_vector<float>());

  // A shape mismatch is an error even when not strict, and nothing is copied.
  auto c = make_cnn();
  StateDict wrong = a->state_dict();
  wrong.tensors["4.weight"] = zeros({3, 7});
  const std::vector<float> c0 = c->state_dict().tensors.at("0.weight").to_vector<float>();
  try {
    c->load_state_dict(wrong, false);
    ADD_FAILURE() << "shape mismatch accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("4.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c->state_dict().tensors.at("0.weight").to_vector<float>(), c0);
}

TEST(StateDictModule, LoadsAcrossDtypes) {
  auto a = make_cnn();
  StateDict half = a->state_dict();
  for (auto& [k, t] : half.tensors)
    if (is_floating(t.dtype())) t = raw::to_dtype(t, DType::f64);
  auto b = make_cnn();
  b->load_state_dict(load_from_bytes(save_to_bytes(half)));
  EXPECT_EQ(b->state_dict().tensors.at("4.weight").dtype(), DType::f32);  // the model keeps its dtype
  EXPECT_EQ(b->state_dict().tensors.at("4.weight").to_vector<float>(),
            a->state_dict().tensors.at("4.weight").to_vector<float>());
}

TEST(SafetensorsCuda, SavesFromAndLoadsToTheDevice) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  StateDict sd = all_dtypes();
  StateDict dev;
  for (auto& [k, t] : sd.tensors) dev.tensors[k] = raw::to_device(t, Device::cuda(0));
  dev.meta = sd.meta;
  const std::string path = temp_dir() + "/cuda.safetensors";
  save(dev, path);
  EXPECT_EQ(read_file(path), save_to_bytes(sd));  // same bytes as from the host
  StateDict back = load(path, Device::cuda(0));
  for (auto& [k, t] : back.tensors) EXPECT_TRUE(t.is_cuda()) << k;
  expect_same(sd, back);
}

}  // namespace
}  // namespace mg::nn
