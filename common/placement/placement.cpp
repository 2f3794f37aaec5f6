// Placement: topology detection (hwloc), the auto and in-process placements, the placement-file
// parser with its validation, cpu lists and the start-up summary.
#include "common/placement/placement.h"

#include <hwloc.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>

#include "common/error.h"

namespace moe::placement {

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxCpuIndex = 65535;
constexpr std::uintmax_t kMaxFileBytes = 1 << 20;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A non-negative decimal integer, digits only (no sign, no spaces).
std::optional<long long> parse_digits(std::string_view s) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

int parse_cpu_index(std::string_view item, std::string_view text) {
  std::optional<long long> v = parse_digits(item);
  if (!v) {
    throw Error("'" + std::string(item) + "' is not a cpu number in cpu list '" +
                std::string(text) + "' (expected N or N-M items separated by commas)");
  }
  if (*v > kMaxCpuIndex) {
    throw Error("cpu " + std::string(item) + " in cpu list '" + std::string(text) +
                "' is too large (at most " + std::to_string(kMaxCpuIndex) + ")");
  }
  return static_cast<int>(*v);
}

std::string threads_text(int n) { return std::to_string(n) + (n == 1 ? " thread" : " threads"); }

// ---- topology lookups --------------------------------------------------------------------------

const std::vector<int>& pus_of(const NumaNode& n) { return n.pus.empty() ? n.cores : n.pus; }

const NumaNode* find_node(const Topology& t, int id) {
  for (const NumaNode& n : t.nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

int node_of_cpu(const Topology& t, int cpu) {
  for (const NumaNode& n : t.nodes) {
    const std::vector<int>& pus = pus_of(n);
    if (std::find(pus.begin(), pus.end(), cpu) != pus.end()) return n.id;
  }
  return -1;
}

std::vector<int> all_pus(const Topology& t) {
  std::vector<int> out;
  for (const NumaNode& n : t.nodes) out.insert(out.end(), pus_of(n).begin(), pus_of(n).end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string node_ids(const Topology& t) {
  std::vector<int> ids;
  for (const NumaNode& n : t.nodes) ids.push_back(n.id);
  std::sort(ids.begin(), ids.end());
  return ids.empty() ? "none" : format_cpu_list(ids);
}

int total_cores(const Topology& t) {
  size_t n = 0;
  for (const NumaNode& node : t.nodes) n += node.cores.size();
  return static_cast<int>(std::min<size_t>(n, kMaxThreads));
}

// ---- placement-file parsing ---------------------------------------------------------------------

// Reports errors as "<file>:<line>: <key>: <what>"; the line is yaml-cpp's 0-based Mark plus one.
class Reporter {
 public:
  explicit Reporter(std::string_view file) : file_(file) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& what) const {
    fail_at(at.Mark(), key, what);
  }
  [[noreturn]] void fail_at(const YAML::Mark& mark, const std::string& key,
                            const std::string& what) const {
    std::string msg = file_;
    if (!mark.is_null() && mark.line >= 0) msg += ":" + std::to_string(mark.line + 1);
    msg += ": ";
    if (!key.empty()) msg += key + ": ";
    throw Error(msg + what);
  }

 private:
  std::string file_;
};

std::string describe_node(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

// Rejects non-scalar, unknown and duplicate keys (yaml-cpp keeps duplicates silently).
void check_keys(const Reporter& r, const YAML::Node& map, const std::string& path,
                std::initializer_list<std::string_view> allowed) {
  std::string allowed_text;
  for (std::string_view a : allowed)
    allowed_text += (allowed_text.empty() ? "" : ", ") + std::string(a);
  std::vector<std::string> seen;
  for (const auto& kv : map) {
    const YAML::Node& key = kv.first;
    if (!key.IsScalar()) r.fail(key, path, "keys must be plain names, got " + describe_node(key));
    const std::string& name = key.Scalar();
    std::string where = path.empty() ? name : path + "." + name;
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      r.fail(key, path, "unknown key '" + name + "' (allowed: " + allowed_text + ")");
    }
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
      r.fail(key, where, "duplicate key");
    }
    seen.push_back(name);
  }
}

// Map lookup without yaml-cpp's operator[] (which may throw or insert); check_keys ran first.
// Returns an undefined node when the key is absent. A key without a value ("threads:" or
// "threads: ~") is an error here, at the key's line: yaml-cpp marks an empty value where the next
// token starts, which can be lines later.
YAML::Node get(const Reporter& r, const YAML::Node& map, const std::string& path,
               std::string_view name) {
  for (const auto& kv : map) {
    if (kv.first.Scalar() != name) continue;
    if (kv.second.IsNull()) {
      std::string key = path.empty() ? std::string(name) : path + "." + std::string(name);
      r.fail(kv.first, key, "no value given (leave the key out to use the default)");
    }
    return kv.second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

bool present(const YAML::Node& n) { return n.IsDefined(); }

int parse_int(const Reporter& r, const YAML::Node& n, const std::string& key,
              std::string_view what = "an integer") {
  if (n.IsScalar()) {
    std::string_view s = n.Scalar();
    bool negative = !s.empty() && s.front() == '-';
    std::optional<long long> v = parse_digits(negative ? s.substr(1) : s);
    if (v && *v <= 1'000'000'000) return static_cast<int>(negative ? -*v : *v);
  }
  r.fail(n, key, "expected " + std::string(what) + ", got " + describe_node(n));
}

int parse_threads(const Reporter& r, const YAML::Node& n, const std::string& key) {
  int v = parse_int(r, n, key);
  if (v < 1 || v > kMaxThreads) {
    r.fail(n, key,
           "must be between 1 and " + std::to_string(kMaxThreads) + ", got " + std::to_string(v));
  }
  return v;
}

// A list of integers or a range string; every cpu must exist on this machine.
std::vector<int> parse_cpus(const Reporter& r, const YAML::Node& n, const std::string& key,
                            const Topology& t) {
  std::vector<int> cpus;
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) {
      int cpu = parse_int(r, n[i], key + "[" + std::to_string(i) + "]", "a cpu number");
      if (cpu < 0) r.fail(n[i], key, "cpu numbers are not negative, got " + std::to_string(cpu));
      if (std::find(cpus.begin(), cpus.end(), cpu) != cpus.end()) {
        r.fail(n[i], key, "cpu " + std::to_string(cpu) + " listed twice");
      }
      cpus.push_back(cpu);
    }
    std::sort(cpus.begin(), cpus.end());
  } else if (n.IsScalar()) {
    try {
      cpus = parse_cpu_list(n.Scalar());
    } catch (const Error& e) {
      r.fail(n, key, e.what());
    }
  } else {
    r.fail(n, key, "expected a cpu list like [0, 1, 2] or \"0-3,8\", got " + describe_node(n));
  }
  if (cpus.empty()) r.fail(n, key, "empty cpu list");
  std::vector<int> machine = all_pus(t);
  for (int cpu : cpus) {
    if (!std::binary_search(machine.begin(), machine.end(), cpu)) {
      r.fail(n, key,
             "cpu " + std::to_string(cpu) + " is not on this machine (cpus: " +
                 (machine.empty() ? "none" : format_cpu_list(machine)) + ")");
    }
  }
  return cpus;
}

struct ParsedWorker {
  CpuWorkerSpec spec;
  YAML::Node cpus_node;  // where overlap errors point
};

ParsedWorker parse_worker(const Reporter& r, const YAML::Node& n, size_t index, const Topology& t) {
  const std::string path = "workers[" + std::to_string(index) + "]";
  if (!n.IsMap()) r.fail(n, path, "expected a map with 'kind: cpu', got " + describe_node(n));
  check_keys(r, n, path, {"kind", "numa_node", "cpus", "threads"});

  YAML::Node kind = get(r, n, path, "kind");
  if (!present(kind)) r.fail(n, path, "missing key 'kind' (only 'cpu' for now)");
  if (!kind.IsScalar()) r.fail(kind, path + ".kind", "expected 'cpu', got " + describe_node(kind));
  if (kind.Scalar() == "gpu") {
    r.fail(kind, path + ".kind", "gpu workers are not supported yet (only 'cpu')");
  }
  if (kind.Scalar() != "cpu") {
    r.fail(kind, path + ".kind", "unknown worker kind '" + kind.Scalar() + "' (allowed: cpu)");
  }

  ParsedWorker w;
  w.spec.id = "cpu-" + std::to_string(index);
  YAML::Node node_n = get(r, n, path, "numa_node");
  YAML::Node cpus_n = get(r, n, path, "cpus");
  YAML::Node threads_n = get(r, n, path, "threads");
  const std::string node_key = path + ".numa_node";
  const std::string cpus_key = path + ".cpus";
  const std::string threads_key = path + ".threads";

  if (present(cpus_n)) w.spec.cpus = parse_cpus(r, cpus_n, cpus_key, t);
  if (present(node_n)) {
    int id = parse_int(r, node_n, node_key);
    if (id == -1 && !present(cpus_n)) {
      r.fail(node_n, node_key, "-1 (no NUMA node) needs cpus to say where the worker runs");
    }
    if (id != -1 && find_node(t, id) == nullptr) {
      r.fail(node_n, node_key,
             "NUMA node " + std::to_string(id) + " is not on this machine (nodes: " + node_ids(t) +
                 ")");
    }
    w.spec.numa_node = id;
  } else if (present(cpus_n)) {
    // The node holding every cpu, -1 when they span nodes.
    w.spec.numa_node = node_of_cpu(t, w.spec.cpus.front());
    for (int cpu : w.spec.cpus) {
      if (node_of_cpu(t, cpu) != w.spec.numa_node) w.spec.numa_node = -1;
    }
  } else {
    r.fail(n, path, "needs numa_node or cpus (or both)");
  }
  if (!present(cpus_n)) {
    const NumaNode* node = find_node(t, w.spec.numa_node);
    if (node->cores.empty()) {
      r.fail(node_n, node_key,
             "NUMA node " + std::to_string(node->id) + " has no cores; give cpus as well");
    }
    w.spec.cpus = node->cores;
  }

  if (present(threads_n)) {
    w.spec.threads = parse_threads(r, threads_n, threads_key);
    if (static_cast<size_t>(w.spec.threads) > w.spec.cpus.size()) {
      std::string cpus_desc = present(cpus_n)
                                  ? std::to_string(w.spec.cpus.size()) + " cpus"
                                  : std::to_string(w.spec.cpus.size()) + " cores of NUMA node " +
                                        std::to_string(w.spec.numa_node) +
                                        " (list cpus to use SMT siblings)";
      r.fail(threads_n, threads_key,
             threads_text(w.spec.threads) + " would oversubscribe the " + cpus_desc);
    }
  } else {
    w.spec.threads = static_cast<int>(std::min<size_t>(w.spec.cpus.size(), kMaxThreads));
  }
  w.cpus_node = present(cpus_n) ? cpus_n : n;
  return w;
}

Placement parse_document(const Reporter& r, const YAML::Node& root, std::string_view source,
                         const Topology& t) {
  if (!root.IsDefined() || root.IsNull()) {
    r.fail(root, "", "empty placement (expected a map with 'workers' or 'in_process')");
  }
  if (!root.IsMap()) {
    r.fail(root, "", "expected a map with 'workers' or 'in_process', got " + describe_node(root));
  }
  check_keys(r, root, "", {"coordinator", "workers", "in_process"});

  Placement p;
  p.source = std::string(source);

  YAML::Node in_process_n = get(r, root, "", "in_process");
  std::optional<bool> in_process_flag;
  if (present(in_process_n)) {
    bool b = false;
    if (!in_process_n.IsScalar() || !YAML::convert<bool>::decode(in_process_n, b)) {
      r.fail(in_process_n, "in_process",
             "expected true or false, got " + describe_node(in_process_n));
    }
    in_process_flag = b;
  }

  std::vector<ParsedWorker> workers;
  YAML::Node workers_n = get(r, root, "", "workers");
  if (present(workers_n)) {
    if (!workers_n.IsSequence()) {
      r.fail(workers_n, "workers",
             "expected a list of workers ([] for in-process), got " + describe_node(workers_n));
    }
    for (size_t i = 0; i < workers_n.size(); ++i) {
      workers.push_back(parse_worker(r, workers_n[i], i, t));
    }
    if (in_process_flag == true && !workers.empty()) {
      r.fail(in_process_n, "in_process", "true contradicts the workers listed");
    }
    if (in_process_flag == false && workers.empty()) {
      r.fail(in_process_n, "in_process",
             "false contradicts 'workers: []' (which means in-process)");
    }
  } else if (in_process_flag != true) {
    r.fail(root, "",
           "missing key 'workers' (use 'workers: []' or 'in_process: true' for in-process)");
  }
  p.in_process = workers.empty();

  // A cpu belongs to one worker: two workers pinned to one core halve each other's speed.
  std::map<int, size_t> owner;
  for (size_t i = 0; i < workers.size(); ++i) {
    for (int cpu : workers[i].spec.cpus) {
      auto [it, inserted] = owner.emplace(cpu, i);
      if (!inserted) {
        const ParsedWorker& first = workers[it->second];
        std::string first_line =
            first.cpus_node.Mark().is_null()
                ? ""
                : " (line " + std::to_string(first.cpus_node.Mark().line + 1) + ")";
        r.fail(workers[i].cpus_node, "workers[" + std::to_string(i) + "].cpus",
               "cpu " + std::to_string(cpu) + " is already used by " + first.spec.id + first_line);
      }
    }
  }
  for (ParsedWorker& w : workers) p.cpu_workers.push_back(std::move(w.spec));

  YAML::Node coord = get(r, root, "", "coordinator");
  YAML::Node threads_n(YAML::NodeType::Undefined), cpus_n(YAML::NodeType::Undefined);
  if (present(coord)) {
    if (!coord.IsMap()) {
      r.fail(coord, "coordinator",
             "expected a map with threads and/or cpus, got " + describe_node(coord));
    }
    check_keys(r, coord, "coordinator", {"threads", "cpus"});
    threads_n = get(r, coord, "coordinator", "threads");
    cpus_n = get(r, coord, "coordinator", "cpus");
  }
  if (present(cpus_n)) p.coordinator_cpus = parse_cpus(r, cpus_n, "coordinator.cpus", t);
  if (present(threads_n)) {
    p.coordinator_threads = parse_threads(r, threads_n, "coordinator.threads");
    if (present(cpus_n) && static_cast<size_t>(p.coordinator_threads) > p.coordinator_cpus.size()) {
      r.fail(threads_n, "coordinator.threads",
             threads_text(p.coordinator_threads) + " would oversubscribe the " +
                 std::to_string(p.coordinator_cpus.size()) + " cpus");
    }
  } else if (present(cpus_n)) {
    p.coordinator_threads =
        static_cast<int>(std::min<size_t>(p.coordinator_cpus.size(), kMaxThreads));
  } else if (p.in_process) {
    p.coordinator_threads = std::max(1, total_cores(t));
  } else {
    const CpuWorkerSpec& first = p.cpu_workers.front();
    const NumaNode* node = find_node(t, first.numa_node);
    size_t n = node != nullptr && !node->cores.empty() ? node->cores.size() : first.cpus.size();
    p.coordinator_threads = static_cast<int>(std::min<size_t>(n, kMaxThreads));
  }
  return p;
}

}  // namespace

// ---- cpu lists ----------------------------------------------------------------------------------

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  if (trim(text).empty()) throw Error("empty cpu list");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = trim(text.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) throw Error("empty item in cpu list '" + std::string(text) + "'");
    size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      lo = hi = parse_cpu_index(item, text);
    } else {
      std::string_view a = trim(item.substr(0, dash)), b = trim(item.substr(dash + 1));
      if (a.empty() || b.empty()) {
        throw Error("bad range '" + std::string(item) + "' in cpu list '" + std::string(text) +
                    "' (expected N-M)");
      }
      lo = parse_cpu_index(a, text);
      hi = parse_cpu_index(b, text);
      if (lo > hi) {
        throw Error("range '" + std::string(item) + "' in cpu list '" + std::string(text) +
                    "' goes backwards");
      }
    }
    // Any list longer than the index space repeats a cpu; stop before it takes unbounded memory.
    if (cpus.size() + static_cast<size_t>(hi - lo) + 1 > static_cast<size_t>(kMaxCpuIndex) + 1) {
      throw Error("cpu list '" + std::string(text) + "' lists a cpu twice");
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  auto dup = std::adjacent_find(cpus.begin(), cpus.end());
  if (dup != cpus.end()) {
    throw Error("cpu " + std::to_string(*dup) + " is listed twice in cpu list '" +
                std::string(text) + "'");
  }
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(sorted[i]);
    if (j > i) out += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

// ---- topology -----------------------------------------------------------------------------------

Topology detect_topology() {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) throw Error("hwloc: cannot initialise the topology");
  struct Destroy {
    hwloc_topology_t t;
    ~Destroy() { hwloc_topology_destroy(t); }
  } destroy{topo};
  if (hwloc_topology_load(topo) != 0) {
    throw Error(std::string("hwloc: cannot read the machine topology: ") + std::strerror(errno));
  }

  // hwloc already drops the PUs of other cgroups; the process's affinity (taskset, numactl
  // --physcpubind, a batch scheduler) restricts further: pinning outside it would fail later.
  hwloc_bitmap_t usable = hwloc_bitmap_alloc();
  if (usable == nullptr) throw Error("hwloc: out of memory");
  struct Free {
    hwloc_bitmap_t b;
    ~Free() { hwloc_bitmap_free(b); }
  } free_usable{usable};
  if (hwloc_get_cpubind(topo, usable, HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(usable)) {
    hwloc_bitmap_copy(usable, hwloc_topology_get_allowed_cpuset(topo));
  }
  hwloc_bitmap_t core_usable = hwloc_bitmap_alloc();
  if (core_usable == nullptr) throw Error("hwloc: out of memory");
  Free free_core_usable{core_usable};

  struct Pu {
    int os;
    bool first_of_core;  // the lowest-numbered usable PU of its core represents the core
  };
  std::vector<Pu> pus;
  const int n_pu = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  for (int i = 0; i < n_pu; ++i) {
    hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, static_cast<unsigned>(i));
    if (pu == nullptr || pu->os_index == HWLOC_UNKNOWN_INDEX) continue;
    if (!hwloc_bitmap_isset(usable, pu->os_index)) continue;
    const int os = static_cast<int>(pu->os_index);
    // Without core information every PU counts as a core.
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
    bool first = true;
    if (core != nullptr) {
      hwloc_bitmap_and(core_usable, core->cpuset, usable);
      first = hwloc_bitmap_first(core_usable) == os;
    }
    pus.push_back({os, first});
  }

  Topology t;
  t.n_pus = static_cast<int>(pus.size());
  const int n_numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n_numa; ++i) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    if (numa == nullptr || numa->os_index == HWLOC_UNKNOWN_INDEX) continue;
    NumaNode node;
    node.id = static_cast<int>(numa->os_index);
    for (const Pu& pu : pus) {
      if (numa->cpuset == nullptr ||
          !hwloc_bitmap_isset(numa->cpuset, static_cast<unsigned>(pu.os))) {
        continue;
      }
      node.pus.push_back(pu.os);
      if (pu.first_of_core) node.cores.push_back(pu.os);
    }
    t.nodes.push_back(std::move(node));
  }
  if (total_cores(t) == 0) {  // no NUMA information: one node 0 holding everything
    NumaNode node;
    for (const Pu& pu : pus) {
      node.pus.push_back(pu.os);
      if (pu.first_of_core) node.cores.push_back(pu.os);
    }
    t.nodes.assign(1, std::move(node));
  }
  for (NumaNode& node : t.nodes) {
    std::sort(node.cores.begin(), node.cores.end());
    std::sort(node.pus.begin(), node.pus.end());
  }
  std::sort(t.nodes.begin(), t.nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return t;
}

// ---- placements ---------------------------------------------------------------------------------

Placement auto_placement(const Topology& t) {
  Placement p;
  p.source = "auto";
  for (const NumaNode& node : t.nodes) {
    if (node.cores.empty()) continue;  // memory-only node: nothing to run there
    CpuWorkerSpec w;
    w.id = "cpu-" + std::to_string(p.cpu_workers.size());
    w.numa_node = node.id;
    w.cpus = node.cores;
    w.threads = static_cast<int>(std::min<size_t>(node.cores.size(), kMaxThreads));
    p.cpu_workers.push_back(std::move(w));
  }
  if (p.cpu_workers.empty()) throw Error("--placement auto: the machine topology lists no cores");
  p.coordinator_cpus = p.cpu_workers.front().cpus;
  p.coordinator_threads = p.cpu_workers.front().threads;
  return p;
}

Placement in_process_placement(const Topology& t, int threads) {
  if (threads < 0 || threads > kMaxThreads) {
    throw Error("in-process placement: threads must be between 1 and " +
                std::to_string(kMaxThreads) + " (0 = every core), got " + std::to_string(threads));
  }
  Placement p;
  p.source = "in-process";
  p.in_process = true;
  if (threads == 0) threads = total_cores(t) > 0 ? total_cores(t) : std::min(t.n_pus, kMaxThreads);
  p.coordinator_threads = std::max(1, threads);
  return p;
}

Placement parse_placement_yaml(std::string_view text, std::string_view source_name,
                               const Topology& t) {
  Reporter r(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    r.fail_at(e.mark, "", "YAML syntax error: " + e.msg);
  }
  try {
    return parse_document(r, root, source_name, t);
  } catch (const YAML::Exception& e) {
    // Only reachable through a yaml-cpp corner we did not foresee; still an error, not a crash.
    r.fail_at(e.mark, "", e.msg);
  }
}

Placement load_placement_file(const std::string& path, const Topology& t) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw Error("placement file '" + path + "': " + ec.message());
  }
  if (!fs::exists(st)) throw Error("placement file '" + path + "': no such file");
  if (!fs::is_regular_file(st)) throw Error("placement file '" + path + "': not a regular file");
  std::uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxFileBytes) {
    throw Error("placement file '" + path +
                "': " + (ec ? ec.message() : "too large (at most 1 MiB)"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) {
    throw Error("placement file '" + path + "': cannot read: " + std::strerror(errno));
  }
  return parse_placement_yaml(text.str(), path, t);
}

Placement resolve_placement(const std::string& spec, const Topology& t, int default_threads) {
  if (spec == "auto") return auto_placement(t);
  if (spec == "in-process") return in_process_placement(t, default_threads);
  if (spec.empty()) throw Error("--placement: empty (use auto, in-process or a file path)");
  return load_placement_file(spec, t);
}

std::string Placement::describe() const {
  std::string out = "placement (" + source + "):\n";
  out += "  coordinator: " + threads_text(coordinator_threads);
  out +=
      coordinator_cpus.empty() ? ", not pinned" : " on cpus " + format_cpu_list(coordinator_cpus);
  out += "\n";
  if (in_process) out += "  no workers: experts are computed in the coordinator\n";
  for (const CpuWorkerSpec& w : cpu_workers) {
    out += "  " + w.id + ": ";
    out += w.numa_node >= 0 ? "NUMA node " + std::to_string(w.numa_node) : "no NUMA node";
    out += ", " + threads_text(w.threads) + " on cpus " + format_cpu_list(w.cpus) + "\n";
  }
  return out;
}

}  // namespace moe::placement
