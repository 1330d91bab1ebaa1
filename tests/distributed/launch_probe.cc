// A rank for tools/launch's test: joins the CPU group from the environment the launcher set,
// checks an all-reduce, and exits with MG_PROBE_EXIT_CODE on rank MG_PROBE_FAIL_RANK.
#include <cstdlib>
#include <iostream>

#include "distributed/process_group.h"

int main() {
  using namespace mg;
  const char* fail = std::getenv("MG_PROBE_FAIL_RANK");
  const char* rank_env = std::getenv("RANK");
  if (fail && rank_env && std::atoi(fail) == std::atoi(rank_env)) return std::atoi(std::getenv("MG_PROBE_EXIT_CODE"));
  dist::ProcessGroupOptions o;
  o.backend = dist::Backend::Cpu;
  auto pg = dist::init_process_group(o);
  Tensor t = full({3}, pg->rank() + 1.0, {DType::f64});
  pg->all_reduce(t);
  const double want = pg->size() * (pg->size() + 1) / 2.0;
  for (double v : t.to_vector<double>())
    if (v != want) return 1;
  std::cout << "rank " << pg->rank() << " of " << pg->size() << " (LOCAL_RANK " << std::getenv("LOCAL_RANK")
            << ", NCCL_NVLS_ENABLE=" << std::getenv("NCCL_NVLS_ENABLE") << ", token " << std::getenv("MG_DIST_TOKEN")
            << ") ok\n";
  return 0;
}
