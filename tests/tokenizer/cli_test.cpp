// moe-tokenize end to end through a shell: encode, --json, --parse-special, --detokenize, errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/tokenizer/tokenizer_testing.h"

namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Result {
  int rc;
  std::string out, err;
};

Result run(const std::string& args, const std::string& input) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const auto in = dir / ("moe_tok_in_" + tag), err = dir / ("moe_tok_err_" + tag);
  std::ofstream(in, std::ios::binary) << input;
  const std::string cmd = shell_quote(std::string(MOE_BIN_DIR) + "/moe-tokenize") + " " + args +
                          " <" + shell_quote(in.string()) + " 2>" + shell_quote(err.string());
  Result r{-1, {}, {}};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(in);
  std::filesystem::remove(err);
  return r;
}

std::string model() {
  return shell_quote((moe::test::testdata_dir() / "models" / "qwen3-vocab-only.gguf").string());
}

TEST(TokenizerCli, Encode) {
  Result r = run("-m " + model(), "Hello world");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "9707 1879\n");
  r = run("-m " + model() + " --json", "Hello world");
  EXPECT_EQ(r.out, "[9707,1879]\n");
  r = run("-m " + model() + " --json", "");
  EXPECT_EQ(r.out, "[]\n");
  r = run("--model " + model() + " --parse-special", "<|im_start|>user");
  EXPECT_EQ(r.out, "151644 872\n");
  r = run("-m " + model(), "<|im_start|>");
  EXPECT_NE(r.out, "151644\n");
}

TEST(TokenizerCli, Detokenize) {
  Result r = run("-m " + model() + " --detokenize", "[151644, 872, 198, 9707, 1879]");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user\nHello world");
  r = run("-m " + model() + " --detokenize", "[158, 224]");  // bytes E2 82 exactly
  EXPECT_EQ(r.out, "\xE2\x82");
}

TEST(TokenizerCli, Errors) {
  Result r = run("-m /nonexistent.gguf", "x");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err.rfind("moe-tokenize: error: ", 0), 0u) << r.err;
  r = run("-m " + model() + " --detokenize", "[1, 999999]");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("out of range"), std::string::npos) << r.err;
  r = run("-m " + model() + " --detokenize", "{\"a\": 1}");
  EXPECT_EQ(r.rc, 1);
  r = run("-m " + model() + " --detokenize", "[1.5]");
  EXPECT_EQ(r.rc, 1);
  r = run("-m " + model() + " --detokenize", "not json");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(run("", "x").rc, 2);                                          // -m missing
  EXPECT_EQ(run("-m " + model() + " --bogus", "x").rc, 2);                // unknown flag
  EXPECT_EQ(run("-m " + model() + " --detokenize --json", "[1]").rc, 2);  // conflicting
}

}  // namespace
