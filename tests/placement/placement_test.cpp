// Placement: cpu lists, placement-file parsing and validation, auto and in-process placements,
// topology detection on this machine and NUMA memory binding.
#include "common/placement/placement.h"

#include <gtest/gtest.h>
#include <numa.h>
#include <numaif.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/placement/numa_binding.h"

namespace {

namespace fs = std::filesystem;
using moe::placement::CpuWorkerSpec;
using moe::placement::format_cpu_list;
using moe::placement::NumaNode;
using moe::placement::parse_cpu_list;
using moe::placement::Placement;
using moe::placement::Topology;
using Cpus = std::vector<int>;

// Runs `fn` and returns the moe::Error message it throws ("" when it throws nothing). Any other
// exception escapes and fails the test.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

// Two sockets with SMT (PU n+8 is the sibling of core n) and a memory-only node 2.
Topology two_node_topology() {
  Topology t;
  t.nodes = {{0, {0, 1, 2, 3}, {0, 1, 2, 3, 8, 9, 10, 11}},
             {1, {4, 5, 6, 7}, {4, 5, 6, 7, 12, 13, 14, 15}},
             {2, {}, {}}};
  t.n_pus = 16;
  return t;
}

Placement parse(const std::string& text) {
  return moe::placement::parse_placement_yaml(text, "p.yaml", two_node_topology());
}
std::string parse_error(const std::string& text) {
  return error_of([&] { parse(text); });
}

// ---- cpu lists ----------------------------------------------------------------------------------

TEST(CpuList, ParsesNumbersAndRanges) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (Cpus{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (Cpus{5}));
  EXPECT_EQ(parse_cpu_list(" 7 , 2-3 "), (Cpus{2, 3, 7}));  // sorted, spaces allowed
  EXPECT_EQ(parse_cpu_list("4-4"), (Cpus{4}));
  EXPECT_EQ(parse_cpu_list("65535"), (Cpus{65535}));
}

TEST(CpuList, RejectsBadLists) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c :
       {Case{"3-1", "goes backwards"}, Case{"a", "'a' is not a cpu number"},
        Case{"1-", "bad range '1-'"}, Case{"-1", "bad range '-1'"}, Case{"", "empty cpu list"},
        Case{"  ", "empty cpu list"}, Case{"1,,2", "empty item"}, Case{"1,", "empty item"},
        Case{"1,1", "cpu 1 is listed twice"}, Case{"0-3,2", "cpu 2 is listed twice"},
        Case{"65536", "too large"}, Case{"1-2-3", "'2-3' is not a cpu number"},
        Case{"0x3", "not a cpu number"}, Case{"+1", "not a cpu number"},
        Case{"99999999999999999999", "not a cpu number"}}) {
    EXPECT_NE(error_of([&] { parse_cpu_list(c.text); }).find(c.message), std::string::npos)
        << "'" << c.text << "' gave: " << error_of([&] { parse_cpu_list(c.text); });
  }
}

TEST(CpuList, HugeRepeatedRangesAreRejectedNotAllocated) {
  std::string text = "0-65535";
  for (int i = 0; i < 2000; ++i) text += ",0-65535";
  EXPECT_NE(error_of([&] { parse_cpu_list(text); }).find("twice"), std::string::npos);
}

TEST(CpuList, FormatsCompactly) {
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({5}), "5");
  EXPECT_EQ(format_cpu_list({1, 2}), "1-2");
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({11, 3, 2, 10, 2}), "2-3,10-11");  // sorts and drops repeats
  EXPECT_EQ(format_cpu_list({0, 2, 4}), "0,2,4");
}

TEST(CpuList, RoundTrips) {
  for (const Cpus& cpus : {Cpus{0}, Cpus{0, 1, 2, 3, 8, 10, 11}, Cpus{1, 3, 5, 6, 7, 100},
                           Cpus{0, 65535}, Cpus{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}) {
    EXPECT_EQ(parse_cpu_list(format_cpu_list(cpus)), cpus) << format_cpu_list(cpus);
  }
  for (const char* text : {"0-3,8,10-11", "7", "0,2,4-6", "1-2,4-5,9-63"}) {
    EXPECT_EQ(format_cpu_list(parse_cpu_list(text)), text);
  }
}

// ---- valid placement files ----------------------------------------------------------------------

TEST(PlacementYaml, EveryKeyGiven) {
  Placement p = parse(R"(coordinator:
  threads: 2
  cpus: [0, 1, 2]
workers:
  - kind: cpu
    numa_node: 0
    cpus: 0-3
    threads: 3
  - kind: cpu
    numa_node: 1
    cpus: "4-7,12"
    threads: 5
)");
  EXPECT_EQ(p.source, "p.yaml");
  EXPECT_FALSE(p.in_process);
  EXPECT_EQ(p.coordinator_threads, 2);
  EXPECT_EQ(p.coordinator_cpus, (Cpus{0, 1, 2}));
  ASSERT_EQ(p.cpu_workers.size(), 2u);
  EXPECT_EQ(p.cpu_workers[0].id, "cpu-0");
  EXPECT_EQ(p.cpu_workers[0].numa_node, 0);
  EXPECT_EQ(p.cpu_workers[0].cpus, (Cpus{0, 1, 2, 3}));
  EXPECT_EQ(p.cpu_workers[0].threads, 3);
  EXPECT_EQ(p.cpu_workers[1].id, "cpu-1");
  EXPECT_EQ(p.cpu_workers[1].numa_node, 1);
  EXPECT_EQ(p.cpu_workers[1].cpus, (Cpus{4, 5, 6, 7, 12}));
  EXPECT_EQ(p.cpu_workers[1].threads, 5);
  EXPECT_EQ(p.describe(),
            "placement (p.yaml):\n"
            "  coordinator: 2 threads on cpus 0-2\n"
            "  cpu-0: NUMA node 0, 3 threads on cpus 0-3\n"
            "  cpu-1: NUMA node 1, 5 threads on cpus 4-7,12\n");
}

TEST(PlacementYaml, DefaultsFromNumaNode) {
  // cpus = the node's cores, threads = their number; coordinator threads = cores of the first
  // worker's node, not pinned. Ids follow file order, not node order.
  Placement p =
      parse("workers:\n  - kind: cpu\n    numa_node: 1\n  - kind: cpu\n    numa_node: 0\n");
  ASSERT_EQ(p.cpu_workers.size(), 2u);
  EXPECT_EQ(p.cpu_workers[0].id, "cpu-0");
  EXPECT_EQ(p.cpu_workers[0].numa_node, 1);
  EXPECT_EQ(p.cpu_workers[0].cpus, (Cpus{4, 5, 6, 7}));
  EXPECT_EQ(p.cpu_workers[0].threads, 4);
  EXPECT_EQ(p.cpu_workers[1].id, "cpu-1");
  EXPECT_EQ(p.cpu_workers[1].numa_node, 0);
  EXPECT_EQ(p.coordinator_threads, 4);
  EXPECT_TRUE(p.coordinator_cpus.empty());
  EXPECT_NE(p.describe().find("coordinator: 4 threads, not pinned\n"), std::string::npos);
}

TEST(PlacementYaml, NumaNodeDefaultsFromCpus) {
  Placement p = parse(R"(workers:
  - kind: cpu
    cpus: 9-10          # SMT siblings on node 0
  - kind: cpu
    cpus: [5, 6]
  - kind: cpu
    cpus: 3,7           # spans nodes 0 and 1
    threads: 1
)");
  ASSERT_EQ(p.cpu_workers.size(), 3u);
  EXPECT_EQ(p.cpu_workers[0].numa_node, 0);
  EXPECT_EQ(p.cpu_workers[0].threads, 2);
  EXPECT_EQ(p.cpu_workers[1].numa_node, 1);
  EXPECT_EQ(p.cpu_workers[1].cpus, (Cpus{5, 6}));
  EXPECT_EQ(p.cpu_workers[2].numa_node, -1);
  EXPECT_EQ(p.cpu_workers[2].threads, 1);
  // The first worker's node (0) has 4 cores.
  EXPECT_EQ(p.coordinator_threads, 4);
  EXPECT_NE(p.describe().find("cpu-2: no NUMA node, 1 thread on cpus 3,7\n"), std::string::npos);
}

TEST(PlacementYaml, CoordinatorThreadsDefaultToItsCpus) {
  Placement p = parse("coordinator:\n  cpus: 8-10\nworkers:\n  - kind: cpu\n    numa_node: 1\n");
  EXPECT_EQ(p.coordinator_threads, 3);
  EXPECT_EQ(p.coordinator_cpus, (Cpus{8, 9, 10}));
}

TEST(PlacementYaml, ExplicitNoNodeAndMemoryOnlyNode) {
  Placement p = parse(R"(workers:
  - kind: cpu
    numa_node: -1
    cpus: 0-1
  - kind: cpu
    numa_node: 2
    cpus: 4-5
)");
  EXPECT_EQ(p.cpu_workers[0].numa_node, -1);
  EXPECT_EQ(p.cpu_workers[1].numa_node, 2);
  EXPECT_EQ(p.cpu_workers[1].cpus, (Cpus{4, 5}));
}

TEST(PlacementYaml, InProcessForms) {
  for (const char* text : {"workers: []\n", "in_process: true\n", "in_process: true\nworkers: []\n",
                           "in_process: true\ncoordinator:\n  threads: 3\n"}) {
    Placement p = parse(text);
    EXPECT_TRUE(p.in_process) << text;
    EXPECT_TRUE(p.cpu_workers.empty()) << text;
  }
  EXPECT_EQ(parse("workers: []\n").coordinator_threads, 8);  // every core of the machine
  Placement p = parse("in_process: true\ncoordinator:\n  threads: 3\n  cpus: 0-3\n");
  EXPECT_EQ(p.coordinator_threads, 3);
  EXPECT_NE(p.describe().find("no workers"), std::string::npos);
  EXPECT_FALSE(parse("in_process: false\nworkers:\n  - kind: cpu\n    numa_node: 0\n").in_process);
}

// ---- invalid placement files --------------------------------------------------------------------

struct BadCase {
  const char* yaml;
  std::vector<const char*> expected;  // substrings of the message
};

void expect_errors(const std::vector<BadCase>& cases) {
  for (const BadCase& c : cases) {
    std::string msg = parse_error(c.yaml);
    ASSERT_FALSE(msg.empty()) << "accepted:\n" << c.yaml;
    for (const char* want : c.expected) {
      EXPECT_NE(msg.find(want), std::string::npos)
          << "message: " << msg << "\nexpected: " << want << "\nyaml:\n"
          << c.yaml;
    }
  }
}

TEST(PlacementYamlErrors, UnknownAndDuplicateKeys) {
  expect_errors({
      {"workers: []\nthreads: 4\n",
       {"p.yaml:2: ", "unknown key 'threads'", "allowed: coordinator, workers, in_process"}},
      {"coordinator:\n  thread: 4\nworkers: []\n",
       {"p.yaml:2: coordinator: unknown key 'thread'", "allowed: threads, cpus"}},
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    numa: 1\n",
       {"p.yaml:4: workers[0]: unknown key 'numa'", "allowed: kind, numa_node, cpus, threads"}},
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    numa_node: 1\n",
       {"p.yaml:4: workers[0].numa_node: duplicate key"}},
      {"workers: []\n[1]: 2\n", {"p.yaml:2: ", "keys must be plain names"}},
  });
}

TEST(PlacementYamlErrors, WrongTypes) {
  expect_errors({
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    threads: abc\n",
       {"p.yaml:4: workers[0].threads: expected an integer, got 'abc'"}},
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    threads: 2.5\n",
       {"p.yaml:4: workers[0].threads: expected an integer"}},
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    threads: [1]\n",
       {"p.yaml:4: workers[0].threads: expected an integer, got a list"}},
      {"workers:\n  - kind: cpu\n    numa_node:\n",
       {"p.yaml:3: workers[0].numa_node: no value given"}},
      {"workers:\n  - kind: cpu\n    cpus: ~\n    threads: 1\n",
       {"p.yaml:3: workers[0].cpus: no value given"}},
      {"workers:\n  - kind: cpu\n    numa_node: zero\n",
       {"p.yaml:3: workers[0].numa_node: expected an integer, got 'zero'"}},
      {"workers:\n  - kind: cpu\n    cpus: {a: 1}\n",
       {"p.yaml:3: workers[0].cpus: expected a cpu list", "got a map"}},
      {"workers:\n  - kind: cpu\n    cpus: [0, x]\n",
       {"p.yaml:3: workers[0].cpus[1]: expected a cpu number, got 'x'"}},
      {"workers:\n  - kind: cpu\n    cpus: [0, -2]\n", {"p.yaml:3: workers[0].cpus: ", "negative"}},
      {"workers:\n  - kind: cpu\n    cpus: [1, 1]\n",
       {"p.yaml:3: workers[0].cpus: cpu 1 listed twice"}},
      {"workers: 5\n", {"p.yaml:1: workers: expected a list", "got '5'"}},
      {"workers:\n", {"p.yaml:1: workers: no value given"}},
      {"workers:\n  - cpu\n", {"p.yaml:2: workers[0]: expected a map", "got 'cpu'"}},
      {"coordinator: 3\nworkers: []\n", {"p.yaml:1: coordinator: expected a map", "got '3'"}},
      {"in_process: maybe\n", {"p.yaml:1: in_process: expected true or false, got 'maybe'"}},
      {"workers:\n  - kind: [cpu]\n", {"p.yaml:2: workers[0].kind: expected 'cpu', got a list"}},
      {"- kind: cpu\n", {"p.yaml:1: ", "expected a map with 'workers'", "got a list"}},
      {"hello\n", {"p.yaml:1: ", "got 'hello'"}},
  });
}

TEST(PlacementYamlErrors, WorkerKind) {
  expect_errors({
      {"workers:\n  - kind: cpu\n    numa_node: 0\n  - kind: gpu\n",
       {"p.yaml:4: workers[1].kind: gpu workers are not supported yet"}},
      {"workers:\n  - kind: tpu\n",
       {"p.yaml:2: workers[0].kind: unknown worker kind 'tpu'", "allowed: cpu"}},
      {"workers:\n  - numa_node: 0\n", {"p.yaml:2: workers[0]: missing key 'kind'"}},
  });
}

TEST(PlacementYamlErrors, MachineChecks) {
  expect_errors({
      {"workers:\n  - kind: cpu\n    numa_node: 7\n",
       {"p.yaml:3: workers[0].numa_node: NUMA node 7 is not on this machine (nodes: 0-2)"}},
      {"workers:\n  - kind: cpu\n    numa_node: -3\n    cpus: 0\n",
       {"p.yaml:3: ", "NUMA node -3 is not on this machine"}},
      {"workers:\n  - kind: cpu\n    cpus: 0-3,99\n",
       {"p.yaml:3: workers[0].cpus: cpu 99 is not on this machine (cpus: 0-15)"}},
      {"coordinator:\n  cpus: [16]\nworkers: []\n",
       {"p.yaml:2: coordinator.cpus: cpu 16 is not on this machine"}},
      {"workers:\n  - kind: cpu\n    numa_node: 2\n",
       {"p.yaml:3: workers[0].numa_node: NUMA node 2 has no cores"}},
      {"workers:\n  - kind: cpu\n    numa_node: -1\n",
       {"p.yaml:3: workers[0].numa_node: -1", "needs cpus"}},
      {"workers:\n  - kind: cpu\n    threads: 2\n",
       {"p.yaml:2: workers[0]: needs numa_node or cpus"}},
  });
}

TEST(PlacementYamlErrors, CpuUsedByTwoWorkers) {
  expect_errors({
      {"workers:\n  - kind: cpu\n    cpus: 0-3\n  - kind: cpu\n    cpus: [4, 3]\n",
       {"p.yaml:5: workers[1].cpus: cpu 3 is already used by cpu-0 (line 3)"}},
      // Defaulted cpus overlap too (both take node 0's cores).
      {"workers:\n  - kind: cpu\n    numa_node: 0\n  - kind: cpu\n    numa_node: 0\n",
       {"p.yaml:4: workers[1].cpus: cpu 0 is already used by cpu-0"}},
  });
}

TEST(PlacementYamlErrors, Threads) {
  expect_errors({
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    threads: 0\n",
       {"p.yaml:4: workers[0].threads: must be between 1 and 1024, got 0"}},
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    threads: -1\n",
       {"p.yaml:4: workers[0].threads: ", "got -1"}},
      {"workers:\n  - kind: cpu\n    numa_node: 0\n    threads: 1025\n",
       {"p.yaml:4: ", "got 1025"}},
      {"workers:\n  - kind: cpu\n    cpus: 0-3\n    threads: 5\n",
       {"p.yaml:4: workers[0].threads: 5 threads would oversubscribe the 4 cpus"}},
      {"workers:\n  - kind: cpu\n    numa_node: 1\n    threads: 8\n",
       {"p.yaml:4: workers[0].threads: ", "4 cores of NUMA node 1", "SMT"}},
      {"coordinator:\n  threads: 3\n  cpus: 0-1\nworkers: []\n",
       {"p.yaml:2: coordinator.threads: 3 threads would oversubscribe the 2 cpus"}},
      {"coordinator:\n  threads: 2000\nworkers: []\n",
       {"p.yaml:2: coordinator.threads: ", "got 2000"}},
  });
}

TEST(PlacementYamlErrors, CpuLists) {
  expect_errors({
      {"workers:\n  - kind: cpu\n    cpus: []\n", {"p.yaml:3: workers[0].cpus: empty cpu list"}},
      {"workers:\n  - kind: cpu\n    cpus: \"\"\n", {"p.yaml:3: workers[0].cpus: empty cpu list"}},
      {"workers:\n  - kind: cpu\n    cpus: 3-1\n",
       {"p.yaml:3: workers[0].cpus: ", "goes backwards"}},
      {"workers:\n  - kind: cpu\n    cpus: a\n",
       {"p.yaml:3: workers[0].cpus: 'a' is not a cpu number"}},
      {"workers:\n  - kind: cpu\n    cpus: 1-\n", {"p.yaml:3: workers[0].cpus: bad range '1-'"}},
  });
}

TEST(PlacementYamlErrors, DocumentLevel) {
  expect_errors({
      {"", {"p.yaml", "empty placement"}},
      {"# only a comment\n", {"p.yaml", "empty placement"}},
      {"coordinator:\n  threads: 2\n", {"p.yaml:1: missing key 'workers'", "in_process: true"}},
      {"in_process: true\nworkers:\n  - kind: cpu\n    numa_node: 0\n",
       {"p.yaml:1: in_process: true contradicts"}},
      {"in_process: false\nworkers: []\n", {"p.yaml:1: in_process: false contradicts"}},
      {"in_process: false\n", {"missing key 'workers'"}},
  });
}

TEST(PlacementYamlErrors, SyntaxErrors) {
  expect_errors({
      {"workers: [\n", {"p.yaml:", "YAML syntax error"}},
      {"workers:\n  - kind: cpu\n   numa_node: 0\n", {"p.yaml:3: YAML syntax error"}},
      {"workers: []\n\tcoordinator: {}\n", {"p.yaml:", "YAML syntax error"}},
      {"a: &x 1\nb: *y\n", {"p.yaml:2: YAML syntax error"}},
  });
}

// Whatever the bytes, parsing ends in a Placement or a moe::Error (error_of lets anything else
// escape and fail the test). Every prefix and single-byte mutation of a valid file is tried.
TEST(PlacementYamlErrors, NeverCrashesOnMangledInput) {
  const std::string valid = R"(coordinator: {threads: 2, cpus: "0-1"}
workers:
  - kind: cpu
    numa_node: 0
    cpus: [0, 1, 2, 3]
    threads: 4
  - {kind: cpu, cpus: "4-7,12-15", threads: 8}
in_process: false
)";
  ASSERT_EQ(parse_error(valid), "");
  size_t errors = 0;
  for (size_t n = 0; n < valid.size(); ++n) {
    if (!parse_error(valid.substr(0, n)).empty()) ++errors;
  }
  const std::string replacements = "-:[]{},&*!|>'\"#%@ \n\t0x";
  for (size_t i = 0; i < valid.size(); ++i) {
    for (char c : replacements) {
      std::string text = valid;
      text[i] = c;
      if (!parse_error(text).empty()) ++errors;
    }
  }
  EXPECT_GT(errors, valid.size());  // most mangled files are errors, not silently accepted
  std::string deep(100000, '[');
  EXPECT_NE(parse_error("workers: " + deep), "");
}

// ---- files and resolve --------------------------------------------------------------------------

class PlacementFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("placement_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(PlacementFile, LoadsAndNamesTheFileInErrors) {
  const Topology t = two_node_topology();
  std::string good = write("good.yaml", "workers:\n  - kind: cpu\n    numa_node: 1\n");
  Placement p = moe::placement::load_placement_file(good, t);
  EXPECT_EQ(p.source, good);
  ASSERT_EQ(p.cpu_workers.size(), 1u);
  EXPECT_EQ(p.cpu_workers[0].cpus, (Cpus{4, 5, 6, 7}));
  EXPECT_EQ(moe::placement::resolve_placement(good, t, 0).cpu_workers.size(), 1u);

  std::string bad = write("bad.yaml", "workers:\n  - kind: cpu\n    numa_node: 9\n");
  EXPECT_NE(error_of([&] { moe::placement::load_placement_file(bad, t); }).find(bad + ":3: "),
            std::string::npos);
  std::string missing = (dir_ / "missing.yaml").string();
  EXPECT_NE(error_of([&] { moe::placement::load_placement_file(missing, t); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              moe::placement::load_placement_file(dir_.string(), t);
            }).find("not a regular file"),
            std::string::npos);
  std::string big = write("big.yaml", std::string(2 << 20, '#'));
  EXPECT_NE(error_of([&] { moe::placement::load_placement_file(big, t); }).find("too large"),
            std::string::npos);
}

TEST(ResolvePlacement, Keywords) {
  const Topology t = two_node_topology();
  Placement a = moe::placement::resolve_placement("auto", t, 3);
  EXPECT_EQ(a.source, "auto");
  EXPECT_EQ(a.cpu_workers.size(), 2u);
  Placement in = moe::placement::resolve_placement("in-process", t, 3);
  EXPECT_EQ(in.source, "in-process");
  EXPECT_TRUE(in.in_process);
  EXPECT_EQ(in.coordinator_threads, 3);
  EXPECT_NE(error_of([&] { moe::placement::resolve_placement("", t, 0); }).find("--placement"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              moe::placement::resolve_placement("/nonexistent/p.yaml", t, 0);
            }).find("/nonexistent/p.yaml"),
            std::string::npos);
}

// ---- auto and in-process ------------------------------------------------------------------------

TEST(AutoPlacement, OneNode) {
  Topology t;
  t.nodes = {{0, {0, 1, 2, 3, 4, 5, 6, 7}}};
  t.n_pus = 8;
  Placement p = moe::placement::auto_placement(t);
  EXPECT_FALSE(p.in_process);
  ASSERT_EQ(p.cpu_workers.size(), 1u);
  EXPECT_EQ(p.cpu_workers[0].id, "cpu-0");
  EXPECT_EQ(p.cpu_workers[0].numa_node, 0);
  EXPECT_EQ(p.cpu_workers[0].threads, 8);
  EXPECT_EQ(p.coordinator_threads, 8);
  EXPECT_EQ(p.coordinator_cpus, (Cpus{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.describe(),
            "placement (auto):\n"
            "  coordinator: 8 threads on cpus 0-7\n"
            "  cpu-0: NUMA node 0, 8 threads on cpus 0-7\n");
}

TEST(AutoPlacement, TwoNodesSkipsMemoryOnlyNodes) {
  Topology t = two_node_topology();
  t.nodes.insert(t.nodes.begin(), NumaNode{5, {}, {}});  // ids need not start at 0
  Placement p = moe::placement::auto_placement(t);
  ASSERT_EQ(p.cpu_workers.size(), 2u);
  EXPECT_EQ(p.cpu_workers[0].id, "cpu-0");
  EXPECT_EQ(p.cpu_workers[0].numa_node, 0);
  EXPECT_EQ(p.cpu_workers[0].cpus, (Cpus{0, 1, 2, 3}));  // cores only, not SMT siblings
  EXPECT_EQ(p.cpu_workers[1].id, "cpu-1");
  EXPECT_EQ(p.cpu_workers[1].numa_node, 1);
  EXPECT_EQ(p.cpu_workers[1].cpus, (Cpus{4, 5, 6, 7}));
  EXPECT_EQ(p.cpu_workers[1].threads, 4);
  EXPECT_EQ(p.coordinator_threads, 4);
  EXPECT_EQ(p.coordinator_cpus, (Cpus{0, 1, 2, 3}));
}

TEST(AutoPlacement, NoCoresIsAnError) {
  Topology t;
  EXPECT_NE(error_of([&] { moe::placement::auto_placement(t); }).find("no cores"),
            std::string::npos);
  t.nodes = {{0, {}, {}}};
  EXPECT_NE(error_of([&] { moe::placement::auto_placement(t); }).find("no cores"),
            std::string::npos);
}

TEST(InProcessPlacement, ThreadsAndDescription) {
  const Topology t = two_node_topology();
  Placement p = moe::placement::in_process_placement(t, 0);
  EXPECT_TRUE(p.in_process);
  EXPECT_TRUE(p.cpu_workers.empty());
  EXPECT_EQ(p.coordinator_threads, 8);
  EXPECT_EQ(moe::placement::in_process_placement(t, 5).coordinator_threads, 5);
  EXPECT_EQ(moe::placement::in_process_placement(t, 1).describe(),
            "placement (in-process):\n"
            "  coordinator: 1 thread, not pinned\n"
            "  no workers: experts are computed in the coordinator\n");
  EXPECT_NE(error_of([&] { moe::placement::in_process_placement(t, -1); }), "");
  EXPECT_NE(error_of([&] { moe::placement::in_process_placement(t, 1025); }), "");
}

// ---- this machine -------------------------------------------------------------------------------

TEST(DetectTopology, ThisMachine) {
  Topology t = moe::placement::detect_topology();
  ASSERT_GE(t.nodes.size(), 1u);
  ASSERT_GE(t.n_pus, 1);
  std::set<int> cores, pus;
  int prev_id = -1;
  for (const NumaNode& n : t.nodes) {
    EXPECT_GT(n.id, prev_id) << "nodes ascending by id";
    prev_id = n.id;
    EXPECT_TRUE(std::is_sorted(n.cores.begin(), n.cores.end()));
    EXPECT_TRUE(std::is_sorted(n.pus.begin(), n.pus.end()));
    for (int c : n.cores) {
      EXPECT_TRUE(cores.insert(c).second) << "core " << c << " in two nodes";
      EXPECT_TRUE(std::binary_search(n.pus.begin(), n.pus.end(), c)) << "core " << c;
    }
    for (int pu : n.pus) {
      EXPECT_TRUE(pus.insert(pu).second) << "pu " << pu << " in two nodes";
      EXPECT_TRUE(fs::exists("/sys/devices/system/cpu/cpu" + std::to_string(pu))) << pu;
    }
  }
  EXPECT_GE(cores.size(), 1u);
  EXPECT_EQ(pus.size(), static_cast<size_t>(t.n_pus));
  EXPECT_LE(cores.size(), pus.size());
  EXPECT_LE(static_cast<long>(pus.size()), sysconf(_SC_NPROCESSORS_ONLN));

  // What detect_topology() returns is usable by the rest of the module.
  Placement p = moe::placement::auto_placement(t);
  EXPECT_GE(p.cpu_workers.size(), 1u);
  std::string file =
      "workers:\n  - kind: cpu\n    numa_node: " + std::to_string(t.nodes[0].id) + "\n";
  EXPECT_EQ(moe::placement::parse_placement_yaml(file, "x.yaml", t).cpu_workers.size(), 1u);
}

// ---- NUMA binding -------------------------------------------------------------------------------

TEST(NumaBinding, NoNodeLeavesPolicyAlone) {
  EXPECT_EQ(moe::placement::bind_memory_to_node(-1), "no NUMA node: memory policy unchanged");
}

TEST(NumaBinding, NodeZeroIsPreferred) {
  const std::string result = moe::placement::bind_memory_to_node(0);
  if (numa_available() < 0) {
    EXPECT_EQ(result, "NUMA not available: memory policy unchanged");
    return;
  }
  ASSERT_EQ(result, "memory preferred on NUMA node 0");
  int mode = -1;
  unsigned long mask = 0;
  ASSERT_EQ(get_mempolicy(&mode, &mask, sizeof(mask) * 8, nullptr, 0), 0);
  EXPECT_EQ(mode, MPOL_PREFERRED);
  EXPECT_EQ(mask, 1ul);
  set_mempolicy(MPOL_DEFAULT, nullptr, 0);  // leave the test process as it was
}

TEST(NumaBinding, MissingNodeThrows) {
  const int missing = numa_available() < 0 ? 1 : numa_max_node() + 1;
  std::string msg = error_of([&] { moe::placement::bind_memory_to_node(missing); });
  EXPECT_NE(msg.find("NUMA node " + std::to_string(missing)), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { moe::placement::bind_memory_to_node(100000); }), "");
}

}  // namespace
