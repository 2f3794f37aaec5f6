#include "coordinator/residency/machine_calibration.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/error.h"

namespace moe::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "moe-runtime calibration";
constexpr int kVersion = 1;
// Bounds on what a corrupt file can make us accept; far above any real machine.
constexpr int64_t kMaxThreads = 1 << 16;
constexpr size_t kMaxThreadEntries = 4096;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error("calibration cache " + path + ": " + why);
}

// Why `c` is not a valid calibration, or empty. Shared by load and save so that whatever is
// saved loads back.
std::string invalid_reason(const MachineCalibration& c) {
  if (c.key.empty()) return "empty key";
  const auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  if (bad(c.h2d_gbps)) return "h2d_gbps must be a finite number >= 0";
  if (bad(c.gpu_us_per_expert)) return "gpu_us_per_expert must be a finite number >= 0";
  if (bad(c.gpu_gbps)) return "gpu_gbps must be a finite number >= 0";
  if (c.cpu_us_per_expert.size() > kMaxThreadEntries) return "too many cpu_us_per_expert entries";
  for (size_t i = 0; i < c.cpu_us_per_expert.size(); ++i) {
    const auto& [threads, us] = c.cpu_us_per_expert[i];
    if (threads < 1 || threads > kMaxThreads) {
      return "cpu_us_per_expert threads " + std::to_string(threads) + " out of range";
    }
    if (bad(us)) return "cpu_us_per_expert values must be finite numbers >= 0";
    // Strictly ascending: cpu_us_at interpolates between neighbours.
    if (i > 0 && threads <= c.cpu_us_per_expert[i - 1].first) {
      return "cpu_us_per_expert thread counts must be strictly ascending";
    }
  }
  return {};
}

double number_field(const json& e, const char* name, const std::string& path) {
  const auto it = e.find(name);
  if (it == e.end() || !it->is_number()) fail(path, std::string(name) + " must be a number");
  return it->get<double>();
}

std::string string_field(const json& e, const char* name, const std::string& path) {
  const auto it = e.find(name);
  if (it == e.end() || !it->is_string()) fail(path, std::string(name) + " must be a string");
  return it->get<std::string>();
}

MachineCalibration parse_entry(const json& e, const std::string& path) {
  if (!e.is_object()) fail(path, "entries must be objects");
  MachineCalibration c;
  c.key = string_field(e, "key", path);
  c.h2d_gbps = number_field(e, "h2d_gbps", path);
  c.gpu_us_per_expert = number_field(e, "gpu_us_per_expert", path);
  if (e.contains("gpu_gbps")) c.gpu_gbps = number_field(e, "gpu_gbps", path);
  c.measured_at = string_field(e, "measured_at", path);
  const auto cpu = e.find("cpu_us_per_expert");
  if (cpu == e.end() || !cpu->is_array()) fail(path, "cpu_us_per_expert must be an array");
  if (cpu->size() > kMaxThreadEntries) fail(path, "too many cpu_us_per_expert entries");
  for (const auto& p : *cpu) {
    if (!p.is_object()) fail(path, "cpu_us_per_expert entries must be objects");
    const auto t = p.find("threads");
    // Unsigned: a negative count is an integer too, but never valid.
    if (t == p.end() || !t->is_number_unsigned() || t->get<uint64_t>() < 1 ||
        t->get<uint64_t>() > static_cast<uint64_t>(kMaxThreads)) {
      fail(path, "cpu_us_per_expert threads must be integers in [1, " +
                     std::to_string(kMaxThreads) + "]");
    }
    c.cpu_us_per_expert.emplace_back(static_cast<int>(t->get<uint64_t>()),
                                     number_field(p, "us_per_expert", path));
  }
  if (const std::string why = invalid_reason(c); !why.empty()) {
    fail(path, "entry " + c.key + ": " + why);
  }
  return c;
}

// Every entry of the file; nullopt when it does not exist, moe::Error when it is malformed.
std::optional<std::vector<MachineCalibration>> read_entries(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    fail(path, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", "") != kFormat) fail(path, "not a calibration cache");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    fail(path, "unsupported version (this build reads version " + std::to_string(kVersion) + ")");
  }
  const auto entries = j.find("entries");
  if (entries == j.end() || !entries->is_array()) fail(path, "entries must be an array");
  std::vector<MachineCalibration> out;
  for (const auto& e : *entries) {
    MachineCalibration c = parse_entry(e, path);
    for (const auto& o : out) {
      if (o.key == c.key) fail(path, "duplicate entry for key " + c.key);
    }
    out.push_back(std::move(c));
  }
  return out;
}

json to_json(const MachineCalibration& c) {
  json cpu = json::array();
  for (const auto& [threads, us] : c.cpu_us_per_expert) {
    cpu.push_back({{"threads", threads}, {"us_per_expert", us}});
  }
  return {{"key", c.key},
          {"h2d_gbps", c.h2d_gbps},
          {"gpu_us_per_expert", c.gpu_us_per_expert},
          {"gpu_gbps", c.gpu_gbps},
          {"cpu_us_per_expert", std::move(cpu)},
          {"measured_at", c.measured_at}};
}

const char* env_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

double MachineCalibration::cpu_us_at(int threads) const {
  const auto& v = cpu_us_per_expert;
  if (v.empty()) return 0;
  if (threads <= v.front().first) return v.front().second;
  if (threads >= v.back().first) return v.back().second;
  // First entry with more threads; its predecessor has fewer or equal.
  const auto hi = std::upper_bound(v.begin(), v.end(), threads,
                                   [](int t, const auto& p) { return t < p.first; });
  const auto lo = hi - 1;
  if (lo->first == threads) return lo->second;
  const double f = static_cast<double>(threads - lo->first) / (hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

std::string machine_key(const std::string& gpu_name, int threads, const std::string& expert_desc) {
  return "cpu=" + cpu_model_name() + "|gpu=" + gpu_name + "|threads=" + std::to_string(threads) +
         "|expert=" + expert_desc;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t b = line.find_first_not_of(" \t", colon + 1);
    if (b == std::string::npos) continue;
    const size_t e = line.find_last_not_of(" \t\r");
    return line.substr(b, e - b + 1);
  }
  return "unknown";
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string default_calibration_path() {
  fs::path dir;
  if (const char* d = env_nonempty("MOE_CACHE_DIR")) {
    dir = d;
  } else if (const char* x = env_nonempty("XDG_CACHE_HOME")) {
    dir = fs::path(x) / "moe-runtime";
  } else if (const char* h = env_nonempty("HOME")) {
    dir = fs::path(h) / ".cache" / "moe-runtime";
  } else {
    std::error_code ec;
    dir = fs::temp_directory_path(ec) / "moe-runtime";
  }
  return (dir / "calibration.json").string();
}

std::optional<MachineCalibration> load_calibration(const std::string& path,
                                                   const std::string& key) {
  auto entries = read_entries(path);
  if (!entries) return std::nullopt;
  for (auto& e : *entries) {
    if (e.key == key) return std::move(e);
  }
  return std::nullopt;
}

void save_calibration(const std::string& path, const MachineCalibration& c) {
  if (const std::string why = invalid_reason(c); !why.empty()) {
    fail(path, "refusing to save an invalid calibration: " + why);
  }
  // Only a cache: a file we cannot use is dropped rather than blocking the new measurement.
  std::vector<MachineCalibration> entries;
  try {
    if (auto old = read_entries(path)) entries = std::move(*old);
  } catch (const Error&) {
    entries.clear();
  }
  json list = json::array();
  bool replaced = false;
  for (const auto& e : entries) {
    if (e.key == c.key) {
      list.push_back(to_json(c));
      replaced = true;
    } else {
      list.push_back(to_json(e));
    }
  }
  if (!replaced) list.push_back(to_json(c));
  const json j = {{"format", kFormat}, {"version", kVersion}, {"entries", std::move(list)}};
  const std::string text = j.dump(2) + '\n';

  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) fail(path, "cannot create directory " + parent.string() + ": " + ec.message());
  }
  // Written beside the target, synced and renamed over it: a crash leaves the old file or the
  // new one, never a torn one.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot write " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  if (::close(fd) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail(path, "cannot write " + tmp + ": " + std::strerror(ok ? errno : saved_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail(path, std::string("cannot replace it: ") + std::strerror(e));
  }
  // Make the rename itself durable; best effort (the data is only a cache).
  const int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

std::vector<std::pair<int, double>> measure_cpu_expert_rates(
    const std::function<std::unique_ptr<ExpertExecutor>(cpu::ThreadPool&)>& make_exec,
    const std::vector<int64_t>& layers, int64_t n_expert, int64_t n_embd,
    const std::vector<int>& thread_counts, int items_per_run, int reps, int spin, int warm_runs) {
  if (!make_exec) throw Error("measure_cpu_expert_rates: no executor factory");
  if (n_embd < 1 || items_per_run < 1 || reps < 1 || layers.empty() || items_per_run > n_expert ||
      std::any_of(layers.begin(), layers.end(), [](int64_t l) { return l < 0; })) {
    throw Error(
        "measure_cpu_expert_rates: need layers >= 0, n_embd, items_per_run and reps >= 1, and "
        "no more items than experts");
  }
  for (size_t i = 0; i < thread_counts.size(); ++i) {
    if (thread_counts[i] < 1 || (i > 0 && thread_counts[i] <= thread_counts[i - 1])) {
      throw Error("measure_cpu_expert_rates: thread counts must be >= 1 and strictly ascending");
    }
  }
  // The same input for every thread count, so that only the threads differ between them.
  std::vector<float> x(static_cast<size_t>(n_embd)), out(x.size());
  std::mt19937 rng(20240611);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  // Distinct experts: a decode token's k routed experts never repeat.
  // Run j reads layer layers[j % L] and the (j / L)-th group of experts: fresh weights each run
  // (every layer, then the next group), as a decode's next layer reads, not a recent run's from
  // the last-level cache.
  std::vector<ExpertItem> items(static_cast<size_t>(items_per_run));
  const auto n_layers = static_cast<int64_t>(layers.size());
  const auto run = [&](ExpertExecutor& exec, int j) {
    const int64_t group = j / n_layers;
    for (int i = 0; i < items_per_run; ++i) {
      const auto e = static_cast<int32_t>((group * items_per_run + i) % n_expert);
      items[static_cast<size_t>(i)] = {0, e, 1.0f / static_cast<float>(items_per_run)};
    }
    exec.run(layers[static_cast<size_t>(j % n_layers)], x.data(), 1, items, out.data());
  };
  const int warm = std::max(warm_runs, reps);

  std::vector<std::pair<int, double>> rates;
  std::vector<double> us(static_cast<size_t>(reps));
  for (const int threads : thread_counts) {
    cpu::ThreadPool pool(threads, {}, spin);
    // Declared after the pool: destroyed before it, as the executor may use it until then.
    const std::unique_ptr<ExpertExecutor> exec = make_exec(pool);
    if (!exec) throw Error("measure_cpu_expert_rates: the factory returned no executor");
    // An untimed pass first: page faults of mapped weights, grow-only scratch. A timed run's
    // weights are then `warm` runs old.
    for (int r = 0; r < warm; ++r) run(*exec, r);
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run(*exec, r);
      const auto t1 = std::chrono::steady_clock::now();
      us[static_cast<size_t>(r)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    // Median: robust against the odd preempted run on a busy machine.
    std::sort(us.begin(), us.end());
    const size_t m = us.size() / 2;
    const double median = us.size() % 2 ? us[m] : 0.5 * (us[m - 1] + us[m]);
    rates.emplace_back(threads, median / items_per_run);
  }
  return rates;
}

int calibration_warm_runs(int64_t reuse_bytes, int64_t expert_bytes, int items_per_run, int reps,
                          int64_t n_layers, int64_t n_expert) {
  if (expert_bytes < 1 || items_per_run < 1 || reps < 1 || n_layers < 1 || n_expert < 1) {
    throw Error("calibration_warm_runs: sizes and counts must be >= 1");
  }
  const int64_t per_run = expert_bytes * items_per_run;
  const int64_t wanted =
      std::max<int64_t>((std::max<int64_t>(reuse_bytes, 0) + per_run - 1) / per_run, reps);
  const int64_t distinct = std::max<int64_t>(n_layers * (n_expert / items_per_run), 1);
  return static_cast<int>(std::max<int64_t>(std::min(wanted, distinct), reps));
}

std::vector<int> calibration_thread_counts(int max_threads) {
  if (max_threads < 1) {
    throw Error("calibration thread count must be >= 1, got " + std::to_string(max_threads));
  }
  std::vector<int> counts;
  for (int64_t t = 1; t < max_threads; t *= 2) counts.push_back(static_cast<int>(t));
  counts.push_back(max_threads);
  return counts;
}

}  // namespace moe::model
