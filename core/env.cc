#include "core/env.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace mg::env {

const std::vector<Switch>& switches() {
  static const std::vector<Switch> table = {
      // CPU backend
      {"MG_NUM_THREADS", "all cores",
       "threads the CPU backend's parallel loops (convolution, pooling, batch norm) use"},
      // CUDA libraries
      {"MG_CUBLASLT", "1", "0 sends every linear through cublasGemmEx and separate bias kernels (A/B runs)"},
      {"MG_CUBLAS_WORKSPACE_MB", "32", "cuBLAS and cuBLASLt workspace per handle, in MiB"},
      {"MG_GEMM_TUNE", "0",
       "1 times the heuristic's top cuBLASLt algorithms once per GEMM shape and keeps the fastest"},
      {"MG_BIAS_GRAD", "reduce",
       "epilogue takes a linear's bias gradient from cuBLASLt's BGRADB epilogue instead of memgrad's column sum"},
      {"MG_CUDNN_BENCHMARK", "0", "1 lets cuDNN time its convolution algorithms (torch.backends.cudnn.benchmark)"},
      {"MG_CUDNN_WORKSPACE_LIMIT_MB", "1024", "the most workspace one cuDNN convolution may take, in MiB"},
      {"MG_DEPTHWISE_NHWC", "auto", "0 runs every depthwise convolution in cuDNN, 1 in memgrad's NHWC kernels"},
      {"MG_ATTENTION_KERNEL", "auto", "forces the attention path: composed, simt, tc (mma.sync tiles) or cudnn"},
      {"MG_ATTENTION_BWD", "auto", "forces the flash backward: onepass or twopass"},
      // Data
      {"MG_FASHION_MNIST", "/usr/share/datasets/fashion-mnist", "where the Fashion-MNIST files are"},
      // Distributed (the launcher's RANK, WORLD_SIZE, MASTER_ADDR ... are read as torchrun names them)
      {"MG_DIST_BACKEND", "nccl with GPUs, else cpu", "the process group's backend: cpu or nccl"},
      {"MG_DIST_TOKEN", "none",
       "the job's shared secret: rank 0 admits only peers that present it (tools/launch makes one); required above one "
       "rank"},
      {"MG_DIST_INIT_FILE", "none", "rendezvous through this file instead of MASTER_ADDR:MASTER_PORT"},
      {"MG_DIST_TIMEOUT_S", "60",
       "seconds any wait (rendezvous, a peer's data, a barrier, a collective) may take before DistributedError"},
      // Tests
      {"MG_TEST_SEED", "fixed per test", "seed for the tests' random inputs (a failing case prints it)"},
      {"MG_SOURCE_ROOT", "the runfiles tree", "where the op table test finds autograd/functions.h"},
  };
  return table;
}

const char* get(const char* name) {
  bool known = false;
  for (const Switch& s : switches()) known = known || std::strcmp(s.name, name) == 0;
  MG_CHECK(known, ValueError, "env: ", name, " is not in the table of switches (core/env.cc)");
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string_view choice(const char* name, std::initializer_list<std::string_view> choices) {
  const char* v = get(name);
  if (!v) return *choices.begin();
  for (std::string_view c : choices)
    if (c == v) return c;
  std::string list;  // "a, b, c or d"
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) list += i + 1 == choices.size() ? " or " : ", ";
    list += choices.begin()[i];
  }
  MG_THROW(ValueError, "env: ", name, " must be ", list, ", got '", v, "'");
}

long integer(const char* name, long fallback) {
  const char* v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  MG_CHECK(end && *end == '\0', ValueError, "env: ", name, " must be an integer, got '", v, "'");
  return n;
}

}  // namespace mg::env
