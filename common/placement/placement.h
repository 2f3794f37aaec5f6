// Placement: which worker processes run and on which NUMA node and cores, plus how many threads the
// coordinator itself uses. Given on the command line as `--placement FILE`, `--placement auto`
// (derived from the machine's topology) or `--placement in-process` (no workers: the coordinator
// computes the experts itself). See docs/placement.md.
//
// Placement file (YAML); every key is optional unless marked, unknown keys are errors:
//
//   coordinator:
//     threads: 4          # default: cpus count if cpus given, else the cores of the first
//                         # worker's NUMA node (every core of the machine when in-process)
//     cpus: 0-3           # a list [0, 1, 2, 3] or a range string "0-3,8,10-11"; default: not
//     pinned
//   workers:              # required unless in_process: true; `workers: []` means in-process
//     - kind: cpu         # required; only "cpu" for now ("gpu" is rejected as not supported yet)
//       numa_node: 0      # default: the node holding its cpus, -1 when they span nodes
//       cpus: 0-7         # default: all cores of numa_node (one PU per physical core)
//       threads: 8        # 1..1024 and at most the number of cpus; default: the number of cpus
//   in_process: true      # optional; same as `workers: []`
//
// A worker needs numa_node or cpus (or both). A cpu may belong to one worker only; the coordinator
// may share cpus with workers (it waits while they compute). Errors throw moe::Error naming the
// file, the 1-based line and the key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moe::placement {

struct NumaNode {
  int id = 0;              // OS index of the node (what libnuma and numactl call it)
  std::vector<int> cores;  // one OS cpu index (PU) per physical core, ascending
  // Every PU of the node, SMT siblings included, ascending. Placement files may pin to any of them.
  // Empty means "same as cores" (convenient for hand-built topologies).
  std::vector<int> pus;
};

struct Topology {
  std::vector<NumaNode> nodes;  // ascending id; a node may have no cores (memory-only)
  int n_pus = 0;                // all online PUs usable by this process
};

// Reads the machine's topology with hwloc, restricted to the cpus this process may use (cgroup and
// affinity): call it before pinning any thread of the process. A machine without NUMA information
// is one node 0 holding every core. Throws moe::Error when hwloc fails.
Topology detect_topology();

struct CpuWorkerSpec {
  std::string id;         // "cpu-0", "cpu-1", ... in file order (node order for auto)
  int numa_node = -1;     // node to keep its memory on; -1: none (cpus span nodes)
  std::vector<int> cpus;  // OS cpu indices to pin its threads to, ascending, never empty
  int threads = 0;        // 1 ≤ threads ≤ cpus.size()
};

struct Placement {
  std::string source;  // "auto", "in-process" or the file path
  bool in_process = false;
  int coordinator_threads = 0;
  std::vector<int> coordinator_cpus;  // may be empty: not pinned
  std::vector<CpuWorkerSpec> cpu_workers;

  // Multi-line human-readable summary printed at start; every line ends with '\n'.
  std::string describe() const;
};

// One worker per NUMA node that has cores, with all of them (threads = cores). The coordinator gets
// the cores of the first such node. Throws moe::Error when the topology has no cores at all.
Placement auto_placement(const Topology& t);

// No workers. `threads` == 0 means every core of the machine; < 0 or > 1024 throws moe::Error.
Placement in_process_placement(const Topology& t, int threads);

// Parses and validates a placement file's text against `t`. `source_name` names the file in
// messages and becomes Placement::source.
Placement parse_placement_yaml(std::string_view text, std::string_view source_name,
                               const Topology& t);
Placement load_placement_file(const std::string& path, const Topology& t);

// "auto", "in-process" (coordinator threads = default_threads, 0 = every core) or a file path.
Placement resolve_placement(const std::string& spec, const Topology& t, int default_threads);

// Linux cpu-list syntax without strides: "0-3,8,10-11" (spaces around items allowed). Returns the
// cpus ascending; throws moe::Error (without file context) on an empty list, a bad number or range
// ("a", "1-", "3-1"), a cpu above 65535 or a cpu listed twice.
std::vector<int> parse_cpu_list(std::string_view text);
// Compact form of a cpu list, ascending, ranges for runs of 2 or more: {0,1,2,3,8} -> "0-3,8".
// Empty input gives "".
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace moe::placement
