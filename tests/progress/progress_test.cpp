// Progress (plain-line and terminal output, MOE_PROGRESS=off, thread-safe counting) and
// prefetch_tensor_data over in-memory, on-disk, split and golden GGUF models.
#include "common/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/gguf.h"
#include "common/gguf_writer.h"
#include "common/model_prefetch.h"
#include "tests/gguf_builder.h"
#include "tests/testdata.h"

namespace moe {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

// Runs each test with MOE_PROGRESS unset (restoring the caller's value) and a temporary file as
// the (non-terminal) output.
class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("MOE_PROGRESS")) saved_ = v;
    ::unsetenv("MOE_PROGRESS");
    out_ = std::tmpfile();
    ASSERT_NE(out_, nullptr);
  }
  void TearDown() override {
    if (out_) std::fclose(out_);
    if (saved_) {
      ::setenv("MOE_PROGRESS", saved_->c_str(), 1);
    } else {
      ::unsetenv("MOE_PROGRESS");
    }
  }

  // Everything written to out_ so far, split into lines.
  std::vector<std::string> lines() {
    std::fflush(out_);
    std::rewind(out_);
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, out_)) > 0;) text.append(buf, n);
    std::fseek(out_, 0, SEEK_END);
    EXPECT_TRUE(text.empty() || text.back() == '\n') << text;
    std::vector<std::string> result;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) result.push_back(l);
    return result;
  }

  std::FILE* out_ = nullptr;
  std::optional<std::string> saved_;
};

const char* const kRate = R"([0-9]+(\.[0-9]+)? (B|KiB|MiB|GiB|TiB)/s)";

TEST_F(ProgressTest, PlainLinesEveryTenPercentThenFinalLine) {
  {
    Progress p("loading model", 10 * kGiB, Progress::Unit::Bytes, out_);
    EXPECT_FALSE(p.tty());
    EXPECT_TRUE(p.drawing());
    for (int i = 0; i < 10; ++i) p.advance(kGiB);
    EXPECT_EQ(p.done(), 10 * kGiB);
  }  // the destructor finishes
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 10u);  // 10% .. 90%, then the final line (100% is the final line)
  for (int i = 0; i < 9; ++i) {
    const std::string pct = std::to_string((i + 1) * 10);
    const std::string done = std::to_string(i + 1) + ".0";
    EXPECT_TRUE(std::regex_match(ls[i], std::regex("loading model: " + pct + "% \\(" + done +
                                                   " / 10\\.0 GiB, " + kRate + "\\)")))
        << ls[i];
  }
  EXPECT_TRUE(std::regex_match(ls[9], std::regex(std::string("loading model: 10\\.0 GiB in "
                                                             "[0-9]+\\.[0-9] s \\(") +
                                                 kRate + "\\)")))
      << ls[9];
}

TEST_F(ProgressTest, BigStepPrintsOneLineWithTheReachedPercentage) {
  Progress p("copy", 1000, Progress::Unit::Count, out_);
  p.advance(5);    // 0%: nothing yet
  p.advance(350);  // 35%: one line, not three
  p.advance(10);   // 36%: same tenth, nothing
  p.finish();
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_TRUE(std::regex_match(ls[0], std::regex(R"(copy: 35% \(355 / 1000, [0-9.]+/s\))")))
      << ls[0];
  EXPECT_TRUE(std::regex_match(ls[1], std::regex(R"(copy: 365 / 1000 in [0-9.]+ s \([0-9.]+/s\))")))
      << ls[1];  // incomplete: says how far it got
}

TEST_F(ProgressTest, AdvanceFromManyThreadsSumsExactly) {
  constexpr int kThreads = 8, kSteps = 20000;
  constexpr uint64_t kStep = 7;
  const uint64_t total = kThreads * kSteps * kStep;
  Progress p("count", total, Progress::Unit::Count, out_);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kSteps; ++i) p.advance(kStep);
      });
    }
  }
  EXPECT_EQ(p.done(), total);
  p.finish();
  p.finish();  // idempotent
  const auto ls = lines();
  ASSERT_GE(ls.size(), 1u);
  ASSERT_LE(ls.size(), 10u);  // at most one line per tenth (the run takes far less than 5 s)
  int last_pct = 0;
  for (size_t i = 0; i + 1 < ls.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(
        std::regex_match(ls[i], m, std::regex(R"(count: ([0-9]+)% \(([0-9]+) / [0-9]+, .*)")))
        << ls[i];
    const int pct = std::stoi(m[1]);
    EXPECT_GT(pct, last_pct) << "percentages must increase";
    last_pct = pct;
  }
  EXPECT_EQ(ls.back().rfind("count: " + std::to_string(total) + " in ", 0), 0u) << ls.back();
}

TEST_F(ProgressTest, OffPrintsOnlyTheFinalLine) {
  ::setenv("MOE_PROGRESS", "off", 1);
  Progress p("loading model", 4 * kGiB, Progress::Unit::Bytes, out_);
  EXPECT_FALSE(p.drawing());
  for (int i = 0; i < 64; ++i) p.advance(kGiB / 16);
  p.finish();
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].rfind("loading model: 4.0 GiB in ", 0), 0u) << ls[0];
}

TEST_F(ProgressTest, UnknownTotalAndEmpty) {
  { Progress p("scan", 0, Progress::Unit::Bytes, out_); }
  Progress q("scan2", 0, Progress::Unit::Bytes, out_);
  q.advance(1536);
  q.finish();
  q.advance(1);  // after finish: counted, nothing printed
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0].rfind("scan: 0 B in ", 0), 0u) << ls[0];
  EXPECT_EQ(ls[1].rfind("scan2: 1.5 KiB in ", 0), 0u) << ls[1];
}

TEST(ProgressFormat, BytesAndDurations) {
  EXPECT_EQ(Progress::format_bytes(512), "512 B");
  EXPECT_EQ(Progress::format_bytes(3.5 * 1024), "3.5 KiB");
  EXPECT_EQ(Progress::format_bytes(6.0 * (1 << 20)), "6.0 MiB");
  EXPECT_EQ(Progress::format_bytes(17.2 * kGiB), "17.2 GiB");
  EXPECT_EQ(Progress::format_bytes(1.4 * kGiB, 2), "1.40 GiB");
  EXPECT_EQ(Progress::format_duration(8.2), "8s");
  EXPECT_EQ(Progress::format_duration(125), "2m05s");
  EXPECT_EQ(Progress::format_duration(3720), "1h02m");
  EXPECT_EQ(Progress::format_duration(-1), "0s");
  EXPECT_EQ(Progress::format_duration(1e300), "99h00m");
}

// On a terminal: a bar redrawn in place with '\r', then the final line on a cleaned line.
TEST_F(ProgressTest, TerminalDrawsBarInPlace) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  std::FILE* tty = ::fdopen(slave, "w");
  ASSERT_NE(tty, nullptr);
  {
    Progress p("loading model", 8 * kGiB, Progress::Unit::Bytes, tty);
    EXPECT_TRUE(p.tty());
    p.advance(kGiB);  // the first advance draws (no rate or ETA yet)
    std::this_thread::sleep_for(std::chrono::milliseconds(520));
    p.advance(3 * kGiB);  // over 100 ms later: redrawn, now with rate and ETA
    p.advance(kGiB);      // probably too soon to draw (not checked: timing)
    p.finish();
  }
  std::fclose(tty);
  std::string text;
  char buf[4096];
  for (pollfd pfd{master, POLLIN, 0}; ::poll(&pfd, 1, 200) > 0;) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  EXPECT_NE(text.find("\rloading model [###-"), std::string::npos) << text;
  EXPECT_NE(text.find(" 12%  1.0 / 8.0 GiB\r"), std::string::npos) << text;
  EXPECT_NE(text.find(" 50%  4.0 / 8.0 GiB  "), std::string::npos) << text;
  EXPECT_NE(text.find("ETA "), std::string::npos) << text;
  EXPECT_NE(text.find("\rloading model: 5.0 / 8.0 GiB in "), std::string::npos) << text;
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;  // the pty turns it into "\r\n"
}

// ----- prefetch -----

class PrefetchTest : public ProgressTest {
 protected:
  void SetUp() override {
    ProgressTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() /
           ("progress_test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    ProgressTest::TearDown();
  }

  static uint64_t sum_sizes(const gguf::GgufFile& f) {
    uint64_t s = 0;
    for (const auto& t : f.tensors()) s += t.n_bytes;
    return s;
  }

  // Prefetches with a Progress and checks the count, the progress and the final line.
  void check_prefetch(const gguf::GgufFile& f, unsigned threads) {
    const uint64_t total = gguf::tensor_data_bytes(f);
    EXPECT_EQ(total, sum_sizes(f));
    Progress p("prefetch", total, Progress::Unit::Bytes, out_);
    EXPECT_EQ(gguf::prefetch_tensor_data(f, &p, threads), total);
    EXPECT_EQ(p.done(), p.total());  // 100%
    p.finish();
    const auto ls = lines();
    ASSERT_FALSE(ls.empty());
    EXPECT_EQ(ls.back().rfind(
                  "prefetch: " + Progress::format_bytes(static_cast<double>(total)) + " in ", 0),
              0u)
        << ls.back();
  }

  std::filesystem::path dir_;
};

TEST_F(PrefetchTest, InMemoryModelWithOddSizes) {
  test::GgufBuilder b;
  b.alignment(32);
  b.add_tensor("a", GgmlType::F32, {10});
  b.add_tensor("b", GgmlType::F16, {33, 3});
  b.add_tensor("c", GgmlType::Q8_0, {256, 41});
  b.add_tensor("d", GgmlType::F32, {1});  // the last tensor ends the buffer: no read past it
  const std::vector<uint8_t> bytes = b.build();
  const gguf::GgufFile f = gguf::GgufFile::parse(bytes);
  for (unsigned threads : {0u, 1u, 2u, 8u}) {
    EXPECT_EQ(gguf::prefetch_tensor_data(f, nullptr, threads), sum_sizes(f));
  }
  check_prefetch(f, 2);
}

TEST_F(PrefetchTest, NoTensors) {
  test::GgufBuilder b;
  b.kv_string("general.architecture", "none");
  const std::vector<uint8_t> bytes = b.build();
  const gguf::GgufFile f = gguf::GgufFile::parse(bytes);
  ASSERT_TRUE(f.tensors().empty());
  Progress p("prefetch", gguf::tensor_data_bytes(f), Progress::Unit::Bytes, out_);
  EXPECT_EQ(gguf::prefetch_tensor_data(f, &p), 0u);
  EXPECT_EQ(p.done(), 0u);
}

// A file on disk with a tensor larger than one 64 MiB chunk, read by three threads.
TEST_F(PrefetchTest, MappedFileWithLargeTensor) {
  gguf::GgufWriter w(64);
  w.set_string("general.architecture", "test");
  w.add_tensor("small", GgmlType::F32, {10});
  w.add_tensor("big", GgmlType::F32, {4096, 4200});  // 65.6 MiB
  w.add_tensor("q", GgmlType::Q8_0, {256, 300});
  w.add_tensor("tail", GgmlType::F16, {33});
  const auto path = (dir_ / "m.gguf").string();
  w.write(path,
          [](size_t i, uint8_t* dst, uint64_t n) { std::memset(dst, static_cast<int>(i + 1), n); });
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  ASSERT_GT(f.find_tensor("big")->n_bytes, 64ull << 20);
  check_prefetch(f, 3);
  EXPECT_EQ(f.find_tensor("big")->data[12345], 2);  // untouched by the prefetch
}

TEST_F(PrefetchTest, SplitModelCoversEveryShard) {
  constexpr uint32_t kShards = 3;
  uint64_t expected = 0;
  for (uint32_t k = 0; k < kShards; ++k) {
    gguf::GgufWriter w(32);
    w.set_u32("split.no", k);
    w.set_u32("split.count", kShards);
    w.add_tensor("t" + std::to_string(k), GgmlType::F32, {1000 + 3 * k, 5 + k});
    expected += w.tensor_bytes(0);
    char name[40];
    std::snprintf(name, sizeof name, "m-%05u-of-%05u.gguf", k + 1, kShards);
    w.write((dir_ / name).string(),
            [](size_t, uint8_t* dst, uint64_t n) { std::memset(dst, 7, n); });
  }
  const gguf::GgufFile f = gguf::GgufFile::open((dir_ / "m-00001-of-00003.gguf").string());
  ASSERT_EQ(f.n_shards(), kShards);
  ASSERT_EQ(f.tensors().size(), kShards);
  EXPECT_EQ(gguf::tensor_data_bytes(f), expected);
  check_prefetch(f, 2);
}

TEST_F(PrefetchTest, GoldenModels) {
  int n_models = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::testdata_dir() / "models")) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().string());
    const gguf::GgufFile f = gguf::GgufFile::open(e.path().string());
    check_prefetch(f, 2);
    ++n_models;
  }
  EXPECT_GE(n_models, 2);
}

}  // namespace
}  // namespace moe
