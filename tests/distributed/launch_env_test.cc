// LaunchEnv: rank, local rank, world size and master address from torchrun's, Slurm's and Open
// MPI's variables, their precedence, malformed values, and the Slurm hostlist expander.
#include "distributed/launch_env.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "distributed/process_group.h"
#include "tests/error_of.h"

namespace mg::dist {
namespace {

using Vars = std::map<std::string, std::string>;

std::string error_of(const Vars& v) {
  return mg::testing::error_of<ValueError>([&] { LaunchEnv::from_variables(v); });
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  LaunchEnv e = LaunchEnv::from_variables({{"HOME", "/root"}});
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, Torchrun) {
  LaunchEnv e = LaunchEnv::from_variables({{"RANK", "5"},
                                           {"LOCAL_RANK", "1"},
                                           {"WORLD_SIZE", "8"},
                                           {"LOCAL_WORLD_SIZE", "4"},
                                           {"MASTER_ADDR", "node07"},
                                           {"MASTER_PORT", "29400"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);        // the data shard
  EXPECT_EQ(e.local_rank, 1);  // the GPU
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node07");
  EXPECT_EQ(e.master_port, 29400);
  // Without LOCAL_RANK a torchrun-style job is one node: the GPU is the rank.
  e = LaunchEnv::from_variables({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(e.local_rank, 3);
}

TEST(LaunchEnv, Slurm) {
  Vars v = {{"SLURM_PROCID", "6"},          {"SLURM_LOCALID", "2"},     {"SLURM_NTASKS", "8"},
            {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_JOB_ID", "123456"}, {"SLURM_JOB_NODELIST", "gpu[01-04,07],cpu3"}};
  LaunchEnv e = LaunchEnv::from_variables(v);
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu01");                 // first host of the job
  EXPECT_EQ(e.master_port, 20000 + 123456 % 10000);  // the same on every node of the job
  v["MASTER_ADDR"] = "10.0.0.5";
  v["MASTER_PORT"] = "29600";
  e = LaunchEnv::from_variables(v);
  EXPECT_EQ(e.master_addr, "10.0.0.5");
  EXPECT_EQ(e.master_port, 29600);
  v.erase("MASTER_ADDR");
  v.erase("SLURM_JOB_NODELIST");
  EXPECT_NE(error_of(v).find("SLURM_JOB_NODELIST"), std::string::npos) << error_of(v);
}

TEST(LaunchEnv, OpenMpi) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "3"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
            {"MASTER_ADDR", "head"}};
  LaunchEnv e = LaunchEnv::from_variables(v);
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.master_addr, "head");
  // Two nodes and no MASTER_ADDR: mpirun does not say where rank 0 is.
  v.erase("MASTER_ADDR");
  const std::string msg = error_of(v);
  EXPECT_NE(msg.find("MASTER_ADDR"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Open MPI rank 3 of 4"), std::string::npos) << msg;
  // One node: rank 0 is on this host.
  v["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  EXPECT_EQ(LaunchEnv::from_variables(v).master_addr, "127.0.0.1");
}

TEST(LaunchEnv, InnermostLauncherWins) {
  // torchrun inside an srun step; mpirun inside a Slurm allocation (SLURM_PROCID=0 inherited).
  LaunchEnv e = LaunchEnv::from_variables(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n1"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 1);
  e = LaunchEnv::from_variables({{"OMPI_COMM_WORLD_RANK", "2"},
                                 {"OMPI_COMM_WORLD_SIZE", "3"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                                 {"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 2);
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}}).find("RANK='one'"), std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "2"}}).find("SLURM_PROCID='-1'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("rank 2 is not below world size 2"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("not a TCP port"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("local rank 3"),
            std::string::npos);
}

TEST(LaunchEnv, ResolveOptionsReadsItAndRequiresAToken) {
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_JOB_NODELIST", "127.0.0.[1-2]", 1);
  unsetenv("MG_DIST_TOKEN");
  std::string msg;
  try {
    resolve_options({});
  } catch (const ValueError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("MG_DIST_TOKEN"), std::string::npos) << msg;
  setenv("MG_DIST_TOKEN", "s3cret", 1);
  ProcessGroupOptions o = resolve_options({});
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.token, "s3cret");
  setenv("MG_DIST_TOKEN", std::string(65, 'x').c_str(), 1);
  EXPECT_THROW(resolve_options({}), ValueError);
  for (const char* v : {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "MG_DIST_TOKEN"})
    unsetenv(v);
}

TEST(Nodelist, ExpandsSlurmsSyntax) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_nodelist("gpu[01-04,07],cpu3"), (V{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"}));
  EXPECT_EQ(expand_nodelist("node1"), (V{"node1"}));
  EXPECT_EQ(expand_nodelist("a[8-10]"), (V{"a8", "a9", "a10"}));
  EXPECT_EQ(expand_nodelist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_nodelist("r[1-2]-n[1,3]"), (V{"r1-n1", "r1-n3", "r2-n1", "r2-n3"}));
  EXPECT_EQ(expand_nodelist("x[1]-ib,y[2-3]"), (V{"x1-ib", "y2", "y3"}));
  EXPECT_EQ(expand_nodelist("10.0.0.[1-2]"), (V{"10.0.0.1", "10.0.0.2"}));
}

TEST(Nodelist, MalformedListsAreValueErrors) {
  for (const char* bad : {"gpu[01-04", "gpu01-04]", "gpu[]", "gpu[4-1]", "gpu[a-b]", "a,,b", "", "gpu[1-[2]]",
                          "gpu[1-2-3]", "x[0-2000000]"})
    EXPECT_THROW(expand_nodelist(bad), ValueError) << bad;
  EXPECT_THROW(expand_nodelist("a[1-10]b[1-10]", 50), ValueError);  // the product is capped too
}

}  // namespace
}  // namespace mg::dist
