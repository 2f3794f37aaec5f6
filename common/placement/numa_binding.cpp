// NUMA memory policy through libnuma.
#include "common/placement/numa_binding.h"

#include <numa.h>
#include <numaif.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/placement/placement.h"

namespace moe::placement {

std::string bind_memory_to_node(int node) {
  const std::string name = "NUMA node " + std::to_string(node);
  if (node < 0) return "no NUMA node: memory policy unchanged";
  if (numa_available() < 0) {
    // Without NUMA support the machine is one node 0 (as detect_topology() reports it).
    if (node == 0) return "NUMA not available: memory policy unchanged";
    throw Error(name + " does not exist: NUMA is not available on this machine (only node 0)");
  }
  if (node > numa_max_node() ||
      numa_bitmask_isbitset(numa_nodes_ptr, static_cast<unsigned>(node)) == 0) {
    std::vector<int> nodes;
    for (int i = 0; i <= numa_max_node(); ++i) {
      if (numa_bitmask_isbitset(numa_nodes_ptr, static_cast<unsigned>(i)) != 0) nodes.push_back(i);
    }
    throw Error(name + " is not configured on this machine (nodes: " + format_cpu_list(nodes) +
                ")");
  }

  // set_mempolicy rather than numa_set_preferred: the latter reports a failure only on stderr,
  // and a worker must be able to say why its memory is not where it asked (e.g. a container's
  // seccomp profile or cpuset forbidding the node).
  struct bitmask* mask = numa_allocate_nodemask();
  numa_bitmask_setbit(mask, static_cast<unsigned>(node));
  const long rc = set_mempolicy(MPOL_PREFERRED, mask->maskp, mask->size + 1);
  const int err = errno;
  numa_free_nodemask(mask);
  if (rc != 0) {
    return "could not prefer " + name + " (set_mempolicy: " + std::strerror(err) +
           "): memory policy unchanged";
  }
  return "memory preferred on " + name;
}

}  // namespace moe::placement
