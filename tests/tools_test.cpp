// The moe-gguf tool, run as a process: info (text and JSON), dequant against the golden values,
// and its error and usage exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "tests/gguf_builder.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int rc = -1;
  std::string out;
  std::string err;
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs moe-gguf with the (already quoted) arguments; stdout and stderr captured separately.
Result run(const std::string& args) {
  const fs::path err_file =
      fs::temp_directory_path() / ("tools_test_" + std::to_string(::getpid()) + ".err");
  const std::string cmd = shell_quote(std::string(MOE_BIN_DIR) + "/moe-gguf") + " " + args + " 2>" +
                          shell_quote(err_file.string());
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err_file);
  fs::remove(err_file);
  return r;
}

fs::path model(const std::string& stem) {
  return moe::test::testdata_dir() / "models" / (stem + ".gguf");
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

TEST(MoeGguf, InfoText) {
  const Result r = run("info " + shell_quote(model("tiny-qwen3moe-sv-Q2_0").string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("version: 3\n"), std::string::npos);
  EXPECT_NE(r.out.find("alignment: 32\n"), std::string::npos);
  EXPECT_NE(r.out.find("general.architecture string = \"qwen3moe\"\n"), std::string::npos);
  EXPECT_NE(r.out.find("qwen3moe.block_count u32 = 4\n"), std::string::npos);
  EXPECT_NE(r.out.find("tokenizer.ggml.tokens [2112 x string] = [\"!\", \"\\\"\", \"#\","),
            std::string::npos);
  EXPECT_NE(r.out.find(", ...]\n"), std::string::npos);
  EXPECT_NE(r.out.find("tensors: 51\n"), std::string::npos);
  // name, type, shape in one row.
  const auto row = r.out.find("blk.0.ffn_down_exps.weight");
  ASSERT_NE(row, std::string::npos);
  const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
  EXPECT_NE(line.find("q2_0"), std::string::npos) << line;
  EXPECT_NE(line.find("256 x 256 x 16"), std::string::npos) << line;
  EXPECT_NE(line.find(std::to_string(256 * 256 * 16 / 64 * 18)), std::string::npos) << line;
  EXPECT_NE(r.out.find("total: 51 tensors, "), std::string::npos);
}

TEST(MoeGguf, InfoJson) {
  const Result r = run("info --json " + shell_quote(model("tiny-qwen3moe-sv-Q2_0").string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["n_tensors"], 51);
  ASSERT_EQ(j["tensors"].size(), 51u);
  const json& meta = j["metadata"];
  EXPECT_EQ(meta["general.architecture"]["type"], "string");
  EXPECT_EQ(meta["general.architecture"]["value"], "qwen3moe");
  EXPECT_EQ(meta["qwen3moe.block_count"]["type"], "u32");
  EXPECT_EQ(meta["qwen3moe.block_count"]["value"], 4);
  const json& tokens = meta["tokenizer.ggml.tokens"];
  EXPECT_EQ(tokens["type"], "array");
  EXPECT_EQ(tokens["element_type"], "string");
  EXPECT_EQ(tokens["count"], 2112);
  ASSERT_EQ(tokens["values"].size(), 8u);
  EXPECT_EQ(tokens["values"][1], "\"");
  bool found = false;
  uint64_t total = 0;
  for (const json& t : j["tensors"]) {
    total += t["bytes"].get<uint64_t>();
    if (t["name"] != "blk.0.ffn_down_exps.weight") continue;
    found = true;
    EXPECT_EQ(t["type"], "q2_0");
    EXPECT_EQ(t["type_id"], 42);
    EXPECT_EQ(t["shape"], json::array({256, 256, 16}));
    EXPECT_EQ(t["bytes"], 256 * 256 * 16 / 64 * 18);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(j["total_bytes"], total);
}

TEST(MoeGguf, InfoOnVocabOnlyFile) {
  const Result r = run("info " + shell_quote(model("qwen3-vocab-only").string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("tokenizer.ggml.tokens [151936 x string] = [\"!\", \"\\\"\", "),
            std::string::npos);
  EXPECT_NE(r.out.find("tokenizer.ggml.merges [151387 x string]"), std::string::npos);
  EXPECT_NE(r.out.find("total: 0 tensors, 0 bytes"), std::string::npos);
}

// First 8 values of every golden entry that starts at element 0, for every model.
TEST(MoeGguf, DequantMatchesGoldenFirstValues) {
  const fs::path golden = moe::test::testdata_dir() / "golden" / "dequant";
  int checked = 0;
  for (const auto& e : fs::directory_iterator(golden)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    const json g = json::parse(in);
    const fs::path file = moe::test::testdata_dir() / "models" / g["model"].get<std::string>();
    for (const json& entry : g["entries"]) {
      if (entry.contains("slice")) continue;  // values of an expert slice, not of element 0
      const std::string tensor = entry["tensor"];
      SCOPED_TRACE(g["model"].get<std::string>() + " " + tensor);
      const Result r =
          run("dequant " + shell_quote(file.string()) + " " + shell_quote(tensor) + " --first 8");
      ASSERT_EQ(r.rc, 0) << r.err;
      const auto got = lines(r.out);
      const json& want = entry["first_8_values"];
      ASSERT_EQ(got.size(), 8u) << r.out;
      ASSERT_EQ(want.size(), 8u);
      for (size_t i = 0; i < 8; ++i) {
        EXPECT_EQ(std::strtof(got[i].c_str(), nullptr), want[i].get<float>())
            << "value " << i << ": printed " << got[i];
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 11);  // at least one tensor per model
}

TEST(MoeGguf, DequantWholeTensorAndFirstZero) {
  const std::string file = shell_quote(model("tiny-qwen3moe-sv-Q4_0").string());
  const Result all = run("dequant " + file + " output_norm.weight");
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_EQ(lines(all.out).size(), 256u);
  const Result none = run("dequant " + file + " output_norm.weight --first 0");
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_EQ(none.out, "");
  // More rows than one: stops after N values across row boundaries.
  const Result some = run("dequant " + file + " blk.0.attn_q.weight --first 300");
  ASSERT_EQ(some.rc, 0) << some.err;
  EXPECT_EQ(lines(some.out).size(), 300u);
}

class MoeGgufErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tools_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(MoeGgufErrors, NonexistentFile) {
  const std::string path = (dir_ / "nope.gguf").string();
  for (const std::string cmd : {"info ", "info --json ", "dequant "}) {
    const Result r = run(cmd + shell_quote(path) + (cmd == "dequant " ? " x" : ""));
    EXPECT_EQ(r.rc, 1) << cmd;
    EXPECT_EQ(r.err, "moe-gguf: error: cannot open '" + path + "': No such file or directory\n");
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(MoeGgufErrors, CorruptFile) {
  const std::string whole = read_file(model("tiny-qwen3moe-sv-Q4_0"));
  const std::string path = write("cut.gguf", whole.substr(0, 5000));
  const Result r = run("info " + shell_quote(path));
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err.rfind("moe-gguf: error: GGUF '" + path + "': truncated", 0), 0u) << r.err;
  EXPECT_EQ(r.out, "");

  const std::string bad_magic = write("magic.gguf", "GGML" + whole.substr(4, 1000));
  const Result m = run("dequant " + shell_quote(bad_magic) + " token_embd.weight");
  EXPECT_EQ(m.rc, 1);
  EXPECT_NE(m.err.find("bad magic"), std::string::npos) << m.err;
}

TEST_F(MoeGgufErrors, UnknownTensorAndNonComputableType) {
  const Result r =
      run("dequant " + shell_quote(model("tiny-qwen3moe-sv-Q4_0").string()) + " no.such.tensor");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("moe-gguf: error: no tensor named 'no.such.tensor'"), std::string::npos)
      << r.err;

  moe::test::GgufBuilder b;
  b.add_tensor("w", moe::GgmlType::IQ2_XXS, {256, 2});
  const auto bytes = b.build();
  const std::string path = write("iq2.gguf", std::string(bytes.begin(), bytes.end()));
  const Result q = run("dequant " + shell_quote(path) + " w");
  EXPECT_EQ(q.rc, 1);
  EXPECT_NE(q.err.find("tensor 'w' has type iq2_xxs (id 16), which this runtime cannot "
                       "dequantize"),
            std::string::npos)
      << q.err;
  // info still lists it.
  const Result i = run("info " + shell_quote(path));
  EXPECT_EQ(i.rc, 0) << i.err;
  EXPECT_NE(i.out.find("iq2_xxs"), std::string::npos);
}

TEST(MoeGgufUsage, UsageErrorsExit2) {
  EXPECT_EQ(run("").rc, 2);
  EXPECT_EQ(run("frobnicate x").rc, 2);
  EXPECT_EQ(run("info").rc, 2);
  EXPECT_EQ(run("dequant " + shell_quote(model("tiny-qwen3moe-sv-Q4_0").string())).rc, 2);
  EXPECT_EQ(run("dequant a b --first -3").rc, 2);
  EXPECT_EQ(run("info a --bogus").rc, 2);
  const Result help = run("--help");
  EXPECT_EQ(help.rc, 0);
  EXPECT_NE(help.out.find("dequant"), std::string::npos);
}

}  // namespace
