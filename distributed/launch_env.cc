// Launcher variables -> LaunchEnv, and the Slurm hostlist expander.
#include "distributed/launch_env.h"

#include <cstdlib>

#include "core/error.h"

extern char** environ;

namespace mg::dist {

namespace {

using Vars = std::map<std::string, std::string>;

const std::string* get(const Vars& v, const char* name) {
  auto it = v.find(name);
  return it == v.end() || it->second.empty() ? nullptr : &it->second;
}

// A non-negative integer below 2^30 (ranks, sizes, ports, job ids modulo their use).
int as_int(const Vars& v, const char* name, int fallback, const char* launcher) {
  const std::string* s = get(v, name);
  if (!s) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(s->c_str(), &end, 10);
  MG_CHECK(end && *end == '\0' && x >= 0 && x < (1LL << 30), ValueError, "init_process_group: ", launcher, " variable ",
           name, "='", *s, "' is not a non-negative integer");
  return static_cast<int>(x);
}

// Expands one hostlist item ("gpu[01-02]-ib[0-1]") into `out`.
void expand_item(const std::string& item, const std::string& whole, size_t max_hosts, std::vector<std::string>& out) {
  std::vector<std::string> acc = {""};
  size_t i = 0;
  while (i < item.size()) {
    if (item[i] != '[') {
      size_t j = item.find('[', i);
      if (j == std::string::npos) j = item.size();
      const std::string lit = item.substr(i, j - i);
      MG_CHECK(lit.find(']') == std::string::npos, ValueError, "expand_nodelist: unbalanced ']' in '", whole, "'");
      for (auto& a : acc) a += lit;
      i = j;
      continue;
    }
    const size_t close = item.find(']', i);
    MG_CHECK(close != std::string::npos, ValueError, "expand_nodelist: unbalanced '[' in '", whole, "'");
    const std::string body = item.substr(i + 1, close - i - 1);
    MG_CHECK(!body.empty() && body.find('[') == std::string::npos, ValueError, "expand_nodelist: bad range '[", body,
             "]' in '", whole, "'");
    std::vector<std::string> values;
    size_t p = 0;
    while (p <= body.size()) {
      size_t q = body.find(',', p);
      if (q == std::string::npos) q = body.size();
      const std::string r = body.substr(p, q - p);
      const size_t dash = r.find('-');
      const std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
      auto digits = [](const std::string& s) {
        return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
      };
      MG_CHECK(digits(lo) && digits(hi), ValueError, "expand_nodelist: '", r, "' in '", whole,
               "' is not a number or a range a-b");
      const long a = std::stol(lo), b = std::stol(hi);
      MG_CHECK(a <= b, ValueError, "expand_nodelist: range '", r, "' in '", whole, "' runs backwards");
      MG_CHECK(static_cast<size_t>(b - a) < max_hosts, ValueError, "expand_nodelist: '", whole, "' names more than ",
               max_hosts, " hosts");
      for (long x = a; x <= b; ++x) {
        std::string s = std::to_string(x);
        if (s.size() < lo.size()) s.insert(0, lo.size() - s.size(), '0');  // "01-04" keeps its width
        values.push_back(std::move(s));
      }
      p = q + 1;
    }
    MG_CHECK(acc.size() * values.size() <= max_hosts, ValueError, "expand_nodelist: '", whole, "' names more than ",
             max_hosts, " hosts");
    std::vector<std::string> next;
    next.reserve(acc.size() * values.size());
    for (const auto& a : acc)
      for (const auto& v : values) next.push_back(a + v);
    acc = std::move(next);
    i = close + 1;
  }
  MG_CHECK(out.size() + acc.size() <= max_hosts, ValueError, "expand_nodelist: '", whole, "' names more than ",
           max_hosts, " hosts");
  out.insert(out.end(), acc.begin(), acc.end());
}

// One launcher's names for rank, world size, local rank and local world size.
struct Names {
  const char *launcher, *display, *rank, *size, *local, *local_size;
};
constexpr Names kTorchrun{"torchrun", "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Names kOpenMpi{"openmpi",
                         "Open MPI",
                         "OMPI_COMM_WORLD_RANK",
                         "OMPI_COMM_WORLD_SIZE",
                         "OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Names kSlurm{"slurm", "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};

void read_ids(const Vars& v, const Names& n, LaunchEnv& e) {
  e.launcher = n.launcher;
  e.rank = as_int(v, n.rank, 0, n.display);
  e.world_size = as_int(v, n.size, 1, n.display);
  // Without a local rank a torchrun-style job is one node: the GPU is the rank.
  e.local_rank = as_int(v, n.local, &n == &kTorchrun ? e.rank : 0, n.display);
  e.local_world_size = as_int(v, n.local_size, -1, n.display);
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& nodelist, size_t max_hosts) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= nodelist.size(); ++i) {
    const char c = i < nodelist.size() ? nodelist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    MG_CHECK(depth >= 0 && depth <= 1, ValueError, "expand_nodelist: unbalanced brackets in '", nodelist, "'");
    if (c == ',' && depth == 0) {
      const std::string item = nodelist.substr(start, i - start);
      MG_CHECK(!item.empty(), ValueError, "expand_nodelist: empty host name in '", nodelist, "'");
      expand_item(item, nodelist, max_hosts, out);
      start = i + 1;
    }
  }
  MG_CHECK(depth == 0, ValueError, "expand_nodelist: unbalanced '[' in '", nodelist, "'");
  return out;
}

LaunchEnv LaunchEnv::from_variables(const Vars& v) {
  LaunchEnv e;
  if (get(v, "RANK") || get(v, "WORLD_SIZE")) {
    read_ids(v, kTorchrun, e);
  } else if (get(v, "OMPI_COMM_WORLD_RANK")) {
    read_ids(v, kOpenMpi, e);
    // mpirun does not say where rank 0 runs; on one node that is here.
    const bool one_node = e.local_world_size == e.world_size;
    MG_CHECK(get(v, "MASTER_ADDR") || one_node, ValueError, "init_process_group: Open MPI rank ", e.rank, " of ",
             e.world_size, " runs on a node with ", e.local_world_size,
             " of the ranks: set MASTER_ADDR to the host of rank 0 (mpirun -x MASTER_ADDR=...)");
  } else if (get(v, "SLURM_PROCID")) {
    read_ids(v, kSlurm, e);
    if (!get(v, "MASTER_ADDR")) {
      const std::string* nl =
          get(v, "SLURM_STEP_NODELIST") ? get(v, "SLURM_STEP_NODELIST") : get(v, "SLURM_JOB_NODELIST");
      MG_CHECK(nl || e.world_size == 1, ValueError, "init_process_group: Slurm rank ", e.rank, " of ", e.world_size,
               ": neither MASTER_ADDR nor SLURM_JOB_NODELIST is set");
      if (nl) e.master_addr = expand_nodelist(*nl, 1 << 20).front();
    }
    if (!get(v, "MASTER_PORT") && get(v, "SLURM_JOB_ID"))
      e.master_port = 20000 + as_int(v, "SLURM_JOB_ID", 0, "Slurm") % 10000;
  }
  if (const std::string* a = get(v, "MASTER_ADDR")) e.master_addr = *a;
  e.master_port = as_int(v, "MASTER_PORT", e.master_port, "launcher");
  MG_CHECK(e.world_size >= 1, ValueError, "init_process_group: ", e.launcher, " world size must be >= 1, got ",
           e.world_size);
  MG_CHECK(e.rank < e.world_size, ValueError, "init_process_group: ", e.launcher, " rank ", e.rank,
           " is not below world size ", e.world_size);
  MG_CHECK(e.local_world_size < 0 || e.local_rank < e.local_world_size, ValueError, "init_process_group: ", e.launcher,
           " local rank ", e.local_rank, " is not below the local world size ", e.local_world_size);
  MG_CHECK(e.master_port > 0 && e.master_port < 65536, ValueError, "init_process_group: MASTER_PORT ", e.master_port,
           " is not a TCP port");
  return e;
}

LaunchEnv LaunchEnv::from_environment() {
  Vars v;
  for (char** p = environ; p && *p; ++p) {
    const std::string kv = *p;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) v.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return from_variables(v);
}

}  // namespace mg::dist
