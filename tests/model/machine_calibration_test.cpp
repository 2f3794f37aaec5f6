// MachineCalibration: the per-machine cache of measured rates saved and loaded back equal, with
// several keys in one file; a missing file or key is a first start; a malformed file is refused
// with a message naming it on load and replaced on save. cpu_us_at's interpolation, the thread
// counts to measure, the default cache path, and measure_cpu_expert_rates on a fake executor
// (its call pattern and arguments) and on the real CPU executor of the tiny test model.
#include "coordinator/residency/machine_calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "experts/cpu_expert_executor.h"
#include "experts/model_config.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using moe::model::ExpertExecutor;
using moe::model::ExpertItem;
using moe::model::MachineCalibration;

MachineCalibration sample(const std::string& key, double scale = 1.0) {
  MachineCalibration c;
  c.key = key;
  c.h2d_gbps = 24.5 * scale;
  c.gpu_us_per_expert = 11.25 * scale;
  c.gpu_gbps = 3500.5 * scale;
  c.cpu_us_per_expert = {{1, 800.0 * scale}, {2, 410.5 * scale}, {4, 220.125 * scale}};
  c.measured_at = "2025-01-02T03:04:05Z";
  return c;
}

void expect_equal(const MachineCalibration& a, const MachineCalibration& b) {
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.h2d_gbps, b.h2d_gbps);
  EXPECT_EQ(a.gpu_us_per_expert, b.gpu_us_per_expert);
  EXPECT_EQ(a.gpu_gbps, b.gpu_gbps);
  EXPECT_EQ(a.cpu_us_per_expert, b.cpu_us_per_expert);
  EXPECT_EQ(a.measured_at, b.measured_at);
}

class MachineCalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moe_machine_calibration_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
  }
  // A well-formed file with one entry whose fields are `entry_fields` (JSON object members).
  void write_entry(const std::string& name, const std::string& entry_fields) const {
    write(name,
          R"({"format":"moe-runtime calibration","version":1,"entries":[{)" + entry_fields + "}]}");
  }
  void expect_refused(const std::string& name, const std::string& part) const {
    try {
      (void)moe::model::load_calibration(path(name), "k");
      ADD_FAILURE() << name << ": loaded";
    } catch (const moe::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path(name)), std::string::npos) << what;
      EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  }
  fs::path dir_;
};

constexpr const char* kGoodCpu = R"("cpu_us_per_expert":[{"threads":1,"us_per_expert":5}])";

TEST_F(MachineCalibrationTest, SavedEntryLoadsBackEqual) {
  // A directory that does not exist yet is created.
  const std::string p = (dir_ / "sub" / "dir" / "calibration.json").string();
  const MachineCalibration c = sample("cpu=x|gpu=y|threads=4|expert=q4_K:123");
  moe::model::save_calibration(p, c);
  const auto back = moe::model::load_calibration(p, c.key);
  ASSERT_TRUE(back.has_value());
  expect_equal(*back, c);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "sub" / "dir")) {
    ++files;
    EXPECT_EQ(e.path().filename(), "calibration.json");
  }
  EXPECT_EQ(files, 1);
}

TEST_F(MachineCalibrationTest, KeysCoexistAndReplacingOneKeepsTheOther) {
  const std::string p = path("c.json");
  moe::model::save_calibration(p, sample("a"));
  moe::model::save_calibration(p, sample("b", 2.0));
  expect_equal(*moe::model::load_calibration(p, "a"), sample("a"));
  expect_equal(*moe::model::load_calibration(p, "b"), sample("b", 2.0));
  MachineCalibration a2 = sample("a", 3.0);
  a2.cpu_us_per_expert = {{8, 99.0}};
  a2.measured_at = "2026-06-07T08:09:10Z";
  moe::model::save_calibration(p, a2);
  expect_equal(*moe::model::load_calibration(p, "a"), a2);
  expect_equal(*moe::model::load_calibration(p, "b"), sample("b", 2.0));
  // Replaced in place, not appended: the file still holds two entries.
  std::ifstream in(p);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t n = 0;
  for (size_t at = text.find("\"key\""); at != std::string::npos; at = text.find("\"key\"", at + 1))
    ++n;
  EXPECT_EQ(n, 2u);
}

TEST_F(MachineCalibrationTest, EmptyMeasurementsRoundTrip) {
  // Nothing measured yet (e.g. GPU part only): zeros and no CPU entries are valid.
  MachineCalibration c;
  c.key = "only-key";
  moe::model::save_calibration(path("c.json"), c);
  const auto back = moe::model::load_calibration(path("c.json"), "only-key");
  ASSERT_TRUE(back.has_value());
  expect_equal(*back, c);
}

TEST_F(MachineCalibrationTest, MissingFileOrKeyIsNullopt) {
  EXPECT_FALSE(moe::model::load_calibration(path("absent.json"), "a").has_value());
  moe::model::save_calibration(path("c.json"), sample("a"));
  EXPECT_FALSE(moe::model::load_calibration(path("c.json"), "b").has_value());
  EXPECT_TRUE(moe::model::load_calibration(path("c.json"), "a").has_value());
}

TEST_F(MachineCalibrationTest, MalformedFilesAreRefusedNamingTheFile) {
  write("bad_json.json", "{\"format\": \"moe-runtime calibration\", ");
  expect_refused("bad_json.json", "not valid JSON");
  write("empty.json", "");
  expect_refused("empty.json", "not valid JSON");
  write("wrong_format.json",
        R"({"format":"moe-runtime routing profile","version":1,"entries":[]})");
  expect_refused("wrong_format.json", "not a calibration cache");
  write("not_object.json", "[1,2,3]");
  expect_refused("not_object.json", "not a calibration cache");
  write("wrong_version.json", R"({"format":"moe-runtime calibration","version":2,"entries":[]})");
  expect_refused("wrong_version.json", "version");
  write("no_entries.json", R"({"format":"moe-runtime calibration","version":1})");
  expect_refused("no_entries.json", "entries");

  const std::string ok_tail = std::string(R"("measured_at":"t",)") + kGoodCpu;
  write_entry("negative.json", R"("key":"k","h2d_gbps":-1,"gpu_us_per_expert":1,)" + ok_tail);
  expect_refused("negative.json", "h2d_gbps");
  write_entry("nan_string.json", R"("key":"k","h2d_gbps":1,"gpu_us_per_expert":"NaN",)" + ok_tail);
  expect_refused("nan_string.json", "gpu_us_per_expert");
  write_entry("overflow.json", R"("key":"k","h2d_gbps":1e999,"gpu_us_per_expert":1,)" + ok_tail);
  expect_refused("overflow.json", "");
  write_entry("missing_field.json", R"("key":"k","gpu_us_per_expert":1,)" + ok_tail);
  expect_refused("missing_field.json", "h2d_gbps");
  write_entry("negative_gpu_gbps.json",
              R"("key":"k","h2d_gbps":1,"gpu_us_per_expert":1,"gpu_gbps":-2,)" + ok_tail);
  expect_refused("negative_gpu_gbps.json", "gpu_gbps");

  const std::string head = R"("key":"k","h2d_gbps":1,"gpu_us_per_expert":1,"measured_at":"t",)";
  write_entry("unsorted.json", head + R"("cpu_us_per_expert":[{"threads":4,"us_per_expert":5},)"
                                      R"({"threads":2,"us_per_expert":9}])");
  expect_refused("unsorted.json", "ascending");
  write_entry("duplicate_threads.json",
              head + R"("cpu_us_per_expert":[{"threads":2,"us_per_expert":5},)"
                     R"({"threads":2,"us_per_expert":9}])");
  expect_refused("duplicate_threads.json", "ascending");
  write_entry("zero_threads.json",
              head + R"("cpu_us_per_expert":[{"threads":0,"us_per_expert":5}])");
  expect_refused("zero_threads.json", "threads");
  write_entry("negative_us.json",
              head + R"("cpu_us_per_expert":[{"threads":1,"us_per_expert":-5}])");
  expect_refused("negative_us.json", "cpu_us_per_expert");

  // Another key's bad entry spoils the file too: it is checked as a whole.
  write("other_key_bad.json",
        R"({"format":"moe-runtime calibration","version":1,"entries":[)"
        R"({"key":"k","h2d_gbps":1,"gpu_us_per_expert":1,"measured_at":"t",)" +
            std::string(kGoodCpu) + R"(},{"key":"z","h2d_gbps":-3}]})");
  expect_refused("other_key_bad.json", "");
  write("duplicate_key.json", R"({"format":"moe-runtime calibration","version":1,"entries":[{)" +
                                  head + kGoodCpu + "},{" + head + kGoodCpu + "}]}");
  expect_refused("duplicate_key.json", "duplicate");

  // The control: the same shape, well-formed, loads (gpu_gbps, measured later, may be absent).
  write_entry("good.json", head + kGoodCpu);
  const auto good = moe::model::load_calibration(path("good.json"), "k");
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(good->cpu_us_per_expert, (std::vector<std::pair<int, double>>{{1, 5.0}}));
  EXPECT_EQ(good->gpu_gbps, 0.0);
}

TEST_F(MachineCalibrationTest, SaveReplacesAMalformedFile) {
  write("c.json", "this is not json");
  moe::model::save_calibration(path("c.json"), sample("a"));
  expect_equal(*moe::model::load_calibration(path("c.json"), "a"), sample("a"));
  write("d.json", R"({"format":"moe-runtime calibration","version":1,"entries":[{"key":"x"}]})");
  moe::model::save_calibration(path("d.json"), sample("b"));
  expect_equal(*moe::model::load_calibration(path("d.json"), "b"), sample("b"));
  EXPECT_FALSE(moe::model::load_calibration(path("d.json"), "x").has_value());
}

TEST_F(MachineCalibrationTest, UnwritablePathThrowsNamingTheFile) {
  // A regular file where a directory should be: fails even as root (no permission games).
  write("blocker", "x");
  const std::string p = (dir_ / "blocker" / "calibration.json").string();
  try {
    moe::model::save_calibration(p, sample("a"));
    ADD_FAILURE() << "saved under a regular file";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  // The target itself a directory: the rename over it fails.
  fs::create_directories(dir_ / "isdir");
  const std::string q = (dir_ / "isdir").string();
  try {
    moe::model::save_calibration(q, sample("a"));
    ADD_FAILURE() << "saved over a directory";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(q), std::string::npos) << e.what();
  }
}

TEST_F(MachineCalibrationTest, InvalidCalibrationIsNotSaved) {
  MachineCalibration c = sample("a");
  c.cpu_us_per_expert = {{4, 1.0}, {2, 2.0}};
  EXPECT_THROW(moe::model::save_calibration(path("c.json"), c), moe::Error);
  c = sample("a");
  c.h2d_gbps = std::nan("");
  EXPECT_THROW(moe::model::save_calibration(path("c.json"), c), moe::Error);
  c = sample("");
  EXPECT_THROW(moe::model::save_calibration(path("c.json"), c), moe::Error);
  EXPECT_FALSE(fs::exists(path("c.json")));
}

TEST(MachineCalibration, CpuUsAtInterpolatesAndClampsToTheEnds) {
  MachineCalibration c;
  EXPECT_EQ(c.cpu_us_at(4), 0.0);
  c.cpu_us_per_expert = {{1, 800.0}, {2, 400.0}, {4, 240.0}, {8, 160.0}};
  EXPECT_DOUBLE_EQ(c.cpu_us_at(1), 800.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(2), 400.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(4), 240.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(8), 160.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(3), 320.0);  // halfway between 2 and 4
  EXPECT_DOUBLE_EQ(c.cpu_us_at(5), 220.0);  // a quarter of the way from 4 to 8
  EXPECT_DOUBLE_EQ(c.cpu_us_at(7), 180.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(0), 800.0);   // below the range: the first entry
  EXPECT_DOUBLE_EQ(c.cpu_us_at(64), 160.0);  // above: the last
  c.cpu_us_per_expert = {{6, 50.0}};
  EXPECT_DOUBLE_EQ(c.cpu_us_at(1), 50.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(6), 50.0);
  EXPECT_DOUBLE_EQ(c.cpu_us_at(12), 50.0);
}

TEST(MachineCalibration, ThreadCountsArePowersOfTwoAndTheMaximum) {
  using V = std::vector<int>;
  EXPECT_EQ(moe::model::calibration_thread_counts(1), (V{1}));
  EXPECT_EQ(moe::model::calibration_thread_counts(2), (V{1, 2}));
  EXPECT_EQ(moe::model::calibration_thread_counts(6), (V{1, 2, 4, 6}));
  EXPECT_EQ(moe::model::calibration_thread_counts(8), (V{1, 2, 4, 8}));
  EXPECT_EQ(moe::model::calibration_thread_counts(16), (V{1, 2, 4, 8, 16}));
  EXPECT_THROW(moe::model::calibration_thread_counts(0), moe::Error);
}

TEST(MachineCalibration, DefaultPathHonoursMoeCacheDir) {
  const char* old = std::getenv("MOE_CACHE_DIR");
  const std::string saved = old ? old : "";
  ASSERT_EQ(setenv("MOE_CACHE_DIR", "/some/cache dir", 1), 0);
  EXPECT_EQ(moe::model::default_calibration_path(), "/some/cache dir/calibration.json");
  // Empty counts as unset: the fallbacks still end in moe-runtime/calibration.json.
  ASSERT_EQ(setenv("MOE_CACHE_DIR", "", 1), 0);
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = xdg ? xdg : "";
  ASSERT_EQ(setenv("XDG_CACHE_HOME", "/xdg", 1), 0);
  EXPECT_EQ(moe::model::default_calibration_path(), "/xdg/moe-runtime/calibration.json");
  ASSERT_EQ(unsetenv("XDG_CACHE_HOME"), 0);
  const std::string fallback = moe::model::default_calibration_path();
  EXPECT_NE(fallback.find("moe-runtime/calibration.json"), std::string::npos) << fallback;
  if (xdg) setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (old) {
    setenv("MOE_CACHE_DIR", saved.c_str(), 1);
  } else {
    unsetenv("MOE_CACHE_DIR");
  }
}

TEST(MachineCalibration, MachineKeyHoldsItsParts) {
  const std::string name = moe::model::cpu_model_name();
  EXPECT_FALSE(name.empty());
  EXPECT_EQ(moe::model::machine_key("NVIDIA H200", 12, "q4_K,q6_K:4423680"),
            "cpu=" + name + "|gpu=NVIDIA H200|threads=12|expert=q4_K,q6_K:4423680");
  const std::string t = moe::model::utc_now_iso8601();
  ASSERT_EQ(t.size(), 20u) << t;
  EXPECT_EQ(t[4], '-');
  EXPECT_EQ(t[10], 'T');
  EXPECT_EQ(t[19], 'Z');
}

// Busy-waits ~200 µs per run and records what it was given.
class FakeExecutor final : public ExpertExecutor {
 public:
  struct Seen {
    int runs = 0;
    int bad = 0;  // calls whose arguments broke the contract
    int pool_size = 0;
    std::set<int64_t> layers;
    std::set<int32_t> experts;
  };
  FakeExecutor(Seen& seen, std::set<int64_t> layers, int64_t n_embd)
      : seen_(seen), layers_(std::move(layers)), n_embd_(n_embd) {}
  void run(int64_t layer, const float* x, int64_t n_tokens, std::span<const ExpertItem> items,
           float* out) override {
    ++seen_.runs;
    std::set<int32_t> experts;
    float sum = 0;
    bool ok = layers_.count(layer) == 1 && n_tokens == 1 && x != nullptr && out != nullptr &&
              !items.empty();
    seen_.layers.insert(layer);
    for (const ExpertItem& it : items) {
      ok = ok && it.token == 0 && it.expert >= 0;
      experts.insert(it.expert);
      seen_.experts.insert(it.expert);
      sum += it.weight;
    }
    ok = ok && experts.size() == items.size() && std::fabs(sum - 1.0f) < 1e-5f;
    if (ok) {
      for (int64_t i = 0; i < n_embd_; ++i) ok = ok && std::isfinite(x[i]);
    }
    if (!ok) ++seen_.bad;
    for (int64_t i = 0; i < n_embd_; ++i) out[i] = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    while (std::chrono::steady_clock::now() < until) {
    }
  }

 private:
  Seen& seen_;
  std::set<int64_t> layers_;
  int64_t n_embd_;
};

TEST(MachineCalibration, MeasuresEveryThreadCountWithTheFakeExecutor) {
  const std::vector<int> counts = {1, 2, 3};
  const int reps = 5, items = 4;
  const int64_t n_expert = 6, n_embd = 64;
  const std::vector<int64_t> layers = {2, 5};
  std::vector<FakeExecutor::Seen> seen;
  seen.reserve(counts.size());
  const auto rates = moe::model::measure_cpu_expert_rates(
      [&](moe::cpu::ThreadPool& pool) -> std::unique_ptr<ExpertExecutor> {
        seen.emplace_back();
        seen.back().pool_size = pool.size();
        return std::make_unique<FakeExecutor>(seen.back(), std::set<int64_t>{2, 5}, n_embd);
      },
      layers, n_expert, n_embd, counts, items, reps, /*spin=*/0);
  ASSERT_EQ(rates.size(), counts.size());
  ASSERT_EQ(seen.size(), counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(rates[i].first, counts[i]);
    EXPECT_TRUE(std::isfinite(rates[i].second) && rates[i].second > 0) << rates[i].second;
    EXPECT_EQ(seen[i].pool_size, counts[i]);
    EXPECT_EQ(seen[i].runs, 2 * reps);  // an untimed pass, then the timed one
    EXPECT_EQ(seen[i].bad, 0);
    // Runs rotate through the layers and the experts (fresh weights each run).
    EXPECT_EQ(seen[i].layers, (std::set<int64_t>{2, 5}));
    EXPECT_EQ(static_cast<int64_t>(seen[i].experts.size()), n_expert);
  }
}

// Records the (layer, experts) of every run, in order.
class RecordingExecutor final : public ExpertExecutor {
 public:
  explicit RecordingExecutor(std::vector<std::pair<int64_t, std::set<int32_t>>>& runs)
      : runs_(runs) {}
  void run(int64_t layer, const float*, int64_t, std::span<const ExpertItem> items,
           float*) override {
    std::set<int32_t> experts;
    for (const ExpertItem& it : items) experts.insert(it.expert);
    runs_.emplace_back(layer, std::move(experts));
  }

 private:
  std::vector<std::pair<int64_t, std::set<int32_t>>>& runs_;
};

// With warm_runs W, each timed run's weights were last read exactly W runs before (by the
// untimed pass), and no run in between read them: the distance the cache must not bridge.
TEST(MachineCalibration, TimedRunsReadWeightsLastReadWarmRunsEarlier) {
  const int reps = 3, warm = 11, items = 2;
  const std::vector<int64_t> layers = {1, 4, 7};
  const int64_t n_expert = 8;  // 3 layers x 4 expert groups: 12 distinct runs
  std::vector<std::pair<int64_t, std::set<int32_t>>> runs;
  moe::model::measure_cpu_expert_rates(
      [&](moe::cpu::ThreadPool&) -> std::unique_ptr<ExpertExecutor> {
        return std::make_unique<RecordingExecutor>(runs);
      },
      layers, n_expert, 16, {1}, items, reps, /*spin=*/0, warm);
  ASSERT_EQ(runs.size(), static_cast<size_t>(warm + reps));
  for (int r = 0; r < reps; ++r) {
    const auto& timed = runs[static_cast<size_t>(warm + r)];
    EXPECT_EQ(timed, runs[static_cast<size_t>(r)]) << "timed run " << r;
    for (int j = r + 1; j < warm + r; ++j) {
      EXPECT_NE(runs[static_cast<size_t>(j)], timed) << "run " << j << " reads timed run " << r;
    }
  }
}

TEST(MachineCalibration, WarmRunsCoverTheReuseDistanceWithinTheDistinctRuns) {
  using moe::model::calibration_warm_runs;
  // 1 GiB over 8 experts of 3 MiB a run: 43 runs; 48 layers x 16 groups are distinct.
  EXPECT_EQ(calibration_warm_runs(int64_t{1} << 30, 3 << 20, 8, 8, 48, 128), 43);
  EXPECT_EQ(calibration_warm_runs(0, 3 << 20, 8, 8, 48, 128), 8);              // at least reps
  EXPECT_EQ(calibration_warm_runs(int64_t{1} << 30, 3 << 20, 4, 2, 2, 8), 4);  // distinct runs
  EXPECT_EQ(calibration_warm_runs(int64_t{1} << 30, 3 << 20, 4, 6, 1, 8), 6);  // reps win
  EXPECT_THROW(calibration_warm_runs(1, 0, 8, 8, 48, 128), moe::Error);
  EXPECT_THROW(calibration_warm_runs(1, 1, 8, 8, 0, 128), moe::Error);
}

TEST(MachineCalibration, MeasureRejectsBadArguments) {
  const auto make = [](moe::cpu::ThreadPool&) -> std::unique_ptr<ExpertExecutor> {
    return nullptr;
  };
  using moe::model::measure_cpu_expert_rates;
  EXPECT_THROW(measure_cpu_expert_rates(make, {0}, 16, 8, {1}, 1, 1, 0), moe::Error);  // null
  EXPECT_THROW(measure_cpu_expert_rates(make, {0}, 16, 8, {2, 1}, 1, 1, 0), moe::Error);
  EXPECT_THROW(measure_cpu_expert_rates(make, {0}, 16, 8, {1}, 0, 1, 0), moe::Error);
  EXPECT_THROW(measure_cpu_expert_rates(make, {0}, 16, 8, {1}, 1, 0, 0), moe::Error);
  EXPECT_THROW(measure_cpu_expert_rates(make, {}, 16, 8, {1}, 1, 1, 0), moe::Error);
  EXPECT_THROW(measure_cpu_expert_rates(make, {-1}, 16, 8, {1}, 1, 1, 0), moe::Error);
  EXPECT_THROW(measure_cpu_expert_rates(make, {0}, 4, 8, {1}, 5, 1, 0), moe::Error);
}

TEST(MachineCalibration, MeasuresTheRealCpuExecutorOnTheTinyModel) {
  const std::string path =
      (moe::test::testdata_dir() / "models" / "tiny-qwen3moe-sv-Q4_K_M.gguf").string();
  const auto file = moe::gguf::GgufFile::open(path);
  const auto cfg = moe::model::ModelConfig::from_gguf(file);
  const int items = static_cast<int>(std::min<int64_t>(cfg.n_expert_used, cfg.n_expert));
  ASSERT_GE(items, 1);
  const auto rates = moe::model::measure_cpu_expert_rates(
      [&](moe::cpu::ThreadPool& pool) -> std::unique_ptr<ExpertExecutor> {
        return moe::model::cpu_experts_for(file, pool);
      },
      {0, 1}, cfg.n_expert, cfg.n_embd, {1, 2}, items, 3, 0);
  ASSERT_EQ(rates.size(), 2u);
  EXPECT_EQ(rates[0].first, 1);
  EXPECT_EQ(rates[1].first, 2);
  for (const auto& [threads, us] : rates) {
    EXPECT_TRUE(std::isfinite(us) && us > 0) << threads << " threads: " << us;
  }
}

}  // namespace
