// Backend constructors behind init_process_group (internal to dist/). The NCCL backend lives in
// its own library, built only with CUDA, and registers its factory at static-initialization time.
#pragma once

#include <memory>

#include "distributed/process_group.h"
#include "distributed/tcp_rendezvous.h"

namespace mg::dist::detail {

using GroupFactory = std::shared_ptr<ProcessGroup> (*)(std::unique_ptr<Star> star, const ProcessGroupOptions& opts);

std::shared_ptr<ProcessGroup> make_cpu_group(std::unique_ptr<Star> star, const ProcessGroupOptions& opts);
// Null unless the NCCL backend was linked in.
GroupFactory& nccl_factory();

}  // namespace mg::dist::detail
