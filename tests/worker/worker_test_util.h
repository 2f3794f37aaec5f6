// Helpers shared by the worker tests: small synthetic models on disk, executor options pointing at
// the built moe-cpu-worker, and a look at /dev/shm for segments this test process left behind.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "experts/model_config.h"
#include "experts/remote_expert_executor.h"
#include "tests/model/synth_model.h"

namespace moe::test {

inline const std::string kWorkerBin = std::string(MOE_BIN_DIR) + "/moe-cpu-worker";
inline constexpr int kThreads = 2;  // the same on both sides: same kernels, same order

// Files removed when the test process exits normally (a forked child that _exit()s leaves them
// to its parent).
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove(p, ec);
  }
};

// A synthetic model of weight type `wtype`, written once per process (2 layers, 6 experts of
// which 2 are used, n_embd 64).
inline std::string synth_model(GgmlType wtype) {
  static TempFiles files;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("moe_worker_test_" + std::to_string(::getpid()) + "_" +
                             std::to_string(static_cast<int>(wtype)) + ".gguf"))
                               .string();
  if (!std::filesystem::exists(path)) {
    SynthSpec spec;
    spec.wtype = wtype;
    write_synth(path, spec);
    files.paths.push_back(path);
  }
  return path;
}

inline model::RemoteExpertOptions worker_options(const std::string& model_path) {
  const auto file = gguf::GgufFile::open(model_path);
  const auto cfg = model::ModelConfig::from_gguf(file);
  model::RemoteExpertOptions o;
  o.worker_bin = kWorkerBin;
  o.model_path = model_path;
  o.n_embd = cfg.n_embd;
  o.threads = kThreads;
  o.max_tokens = 64;
  o.max_items = 64 * cfg.n_expert_used;
  o.spin = 0;  // tests share few cores with the worker
  return o;
}

// /dev/shm entries named after this process ("moe-<pid>-...").
inline std::vector<std::string> our_segments() {
  std::vector<std::string> found;
  const std::string prefix = "moe-" + std::to_string(::getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(prefix)) found.push_back(name);
  }
  return found;
}

// The message of the moe::Error `fn` throws; "" when it throws nothing.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moe::test
