// Where this process sits in a job, read from the variables of the launcher that started it:
// torchrun (and tools/launch), Slurm's srun, or Open MPI's mpirun. LOCAL_RANK picks the GPU,
// RANK picks the data shard; init_process_group reads it for every option left unset.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace mg::dist {

struct LaunchEnv {
  // Which variables were read: "torchrun" (RANK/WORLD_SIZE, also tools/launch and spawn_ranks),
  // "openmpi" (OMPI_COMM_WORLD_*), "slurm" (SLURM_PROCID/SLURM_NTASKS), or "none" (one process).
  std::string launcher = "none";
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;  // processes on this node (-1 when the launcher does not say)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // From the process environment. Precedence: RANK (torchrun, tools/launch) over
  // OMPI_COMM_WORLD_RANK over SLURM_PROCID, so torchrun inside an srun step and mpirun inside a
  // Slurm allocation read the innermost launcher. MASTER_ADDR/MASTER_PORT win when set; else
  // Slurm's master is the first host of SLURM_JOB_NODELIST and its port 20000 + SLURM_JOB_ID %
  // 10000 (the same on every node of the job); Open MPI across several nodes needs MASTER_ADDR.
  // Raises ValueError naming the variable when one is malformed or inconsistent.
  static LaunchEnv from_environment();
  // The same from an explicit variable map (tests; a variable that is absent or empty is unset).
  static LaunchEnv from_variables(const std::map<std::string, std::string>& vars);
};

// Expands a Slurm hostlist ("gpu[01-04,07],cpu3" -> gpu01 gpu02 gpu03 gpu04 gpu07 cpu3): comma
// separated items, each with any number of [ranges] (zero padding kept, the product of several
// brackets taken in order). Raises ValueError on malformed input or more than `max_hosts` names.
std::vector<std::string> expand_nodelist(const std::string& nodelist, size_t max_hosts = 1 << 20);

}  // namespace mg::dist
