// Loading errors name the tensor or key; the moe-run tool's exit codes and outputs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "tests/model/gguf_rewrite.h"
#include "tests/model/synth_model.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::GgmlType;

std::string tmp_path(const std::string& tag) {
  return (fs::temp_directory_path() /
          ("moe_model_err_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// Loads a synth model built with `spec` and returns the load error ("" if it loaded).
std::string load_error(const moe::test::SynthSpec& spec, const std::string& tag) {
  const std::string path = tmp_path(tag);
  moe::test::write_synth(path, spec);
  std::string err;
  try {
    const auto file = moe::gguf::GgufFile::open(path);
    moe::cpu::ThreadPool pool(1);
    auto model = create_model_arch(file, pool);
  } catch (const moe::Error& e) {
    err = e.what();
  }
  fs::remove(path);
  return err;
}

TEST(ModelErrors, ValidModelLoads) { EXPECT_EQ(load_error({}, "ok"), ""); }

TEST(ModelErrors, MissingTensorIsNamed) {
  moe::test::SynthSpec s;
  s.mutate = [](const std::string& n, GgmlType&, std::vector<int64_t>&, bool& skip) {
    skip = n == "blk.1.ffn_up_exps.weight";
  };
  const std::string err = load_error(s, "missing");
  EXPECT_NE(err.find("blk.1.ffn_up_exps.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

TEST(ModelErrors, WrongShapeIsNamed) {
  moe::test::SynthSpec s;  // n_ff 64, n_embd 64, 6 experts
  s.mutate = [](const std::string& n, GgmlType&, std::vector<int64_t>& ne, bool&) {
    if (n == "blk.0.ffn_down_exps.weight") ne = {64, 64, 5};
  };
  EXPECT_EQ(load_error(s, "shape"),
            "blk.0.ffn_down_exps.weight: expected shape 64x64x6, found 64x64x5");
}

TEST(ModelErrors, UnsupportedTypeIsNamed) {
  moe::test::SynthSpec s;
  s.mutate = [](const std::string& n, GgmlType& t, std::vector<int64_t>&, bool&) {
    if (n == "blk.1.attn_q.weight") t = GgmlType::I32;
  };
  const std::string err = load_error(s, "type");
  EXPECT_NE(err.find("blk.1.attn_q.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("i32"), std::string::npos) << err;
}

TEST(ModelErrors, BadHyperparametersAreNamed) {
  moe::test::SynthSpec s;
  s.n_expert_used = 7;  // more than the 6 experts
  const std::string err = load_error(s, "hparams");
  EXPECT_NE(err.find("expert_used_count"), std::string::npos) << err;
  moe::test::SynthSpec q;
  q.n_head = 3;  // not a multiple of 2 KV heads
  EXPECT_NE(load_error(q, "heads").find("head_count_kv"), std::string::npos);
}

TEST(ModelErrors, TiedOutputLoads) {
  moe::test::SynthSpec s;
  s.tied = true;
  EXPECT_EQ(load_error(s, "tied"), "");
}

// ---- qwen35moe: the tiny F16 model rewritten with one defect ----

std::string qwen35_error(const moe::test::GgufEdit& e, const std::string& tag) {
  const std::string src =
      (moe::test::qwen35moe_testdata_dir() / "models" / "tiny-qwen35moe-sv-F16.gguf").string();
  const std::string path = tmp_path("q35_" + tag);
  moe::test::rewrite_gguf(src, path, e);
  std::string err;
  try {
    const auto file = moe::gguf::GgufFile::open(path);
    moe::cpu::ThreadPool pool(1);
    auto model = create_model_arch(file, pool);
  } catch (const moe::Error& ex) {
    err = ex.what();
  }
  fs::remove(path);
  return err;
}

moe::test::GgufEdit drop_tensor(const std::string& name) {
  moe::test::GgufEdit e;
  e.mutate = [name](const std::string& n, GgmlType&, std::vector<int64_t>&, bool& skip) {
    skip = n == name;
  };
  return e;
}

moe::test::GgufEdit drop_key(const std::string& key) {
  moe::test::GgufEdit e;
  e.drop_key = [key](const std::string& k) { return k == key; };
  return e;
}

TEST(ModelErrors, Qwen35MoeLoadsAndNamesDefects) {
  EXPECT_EQ(qwen35_error({}, "ok"), "");
  for (const char* t : {"blk.1.ssm_a", "blk.2.ssm_conv1d.weight", "blk.0.ffn_gate_inp_shexp.weight",
                        "blk.3.attn_q_norm.weight", "blk.1.ffn_down_exps.weight"}) {
    const std::string err = qwen35_error(drop_tensor(t), "missing");
    EXPECT_NE(err.find(std::string(t) + ": required tensor is missing"), std::string::npos) << err;
  }
  moe::test::GgufEdit conv;
  conv.mutate = [](const std::string& n, GgmlType&, std::vector<int64_t>& ne, bool&) {
    if (n == "blk.0.ssm_conv1d.weight") ne = {3, 1024};
  };
  EXPECT_EQ(qwen35_error(conv, "conv"),
            "blk.0.ssm_conv1d.weight: expected shape 4x1024, found 3x1024");
  // attn_q without the per-head output-gate rows.
  moe::test::GgufEdit q;
  q.mutate = [](const std::string& n, GgmlType&, std::vector<int64_t>& ne, bool&) {
    if (n == "blk.3.attn_q.weight") ne = {256, 256};
  };
  EXPECT_EQ(qwen35_error(q, "q"), "blk.3.attn_q.weight: expected shape 256x512, found 256x256");
  for (const char* k :
       {"qwen35moe.ssm.state_size", "qwen35moe.ssm.conv_kernel", "qwen35moe.ssm.group_count",
        "qwen35moe.rope.dimension_sections", "qwen35moe.expert_shared_feed_forward_length"}) {
    const std::string err = qwen35_error(drop_key(k), "key");
    EXPECT_NE(err.find(k), std::string::npos) << err;
  }
  moe::test::GgufEdit nextn;
  nextn.add_keys = [](moe::gguf::GgufWriter& w) { w.set_u32("qwen35moe.nextn_predict_layers", 4); };
  EXPECT_NE(qwen35_error(nextn, "nextn").find("qwen35moe.nextn_predict_layers"), std::string::npos);
  moe::test::GgufEdit heads;  // 8 value heads are not a multiple of 3 key heads
  heads.drop_key = [](const std::string& k) { return k == "qwen35moe.ssm.group_count"; };
  heads.add_keys = [](moe::gguf::GgufWriter& w) { w.set_u32("qwen35moe.ssm.group_count", 3); };
  EXPECT_NE(qwen35_error(heads, "heads").find("qwen35moe.ssm.time_step_rank"), std::string::npos);
  // A different layer pattern asks for the tensors of the other layer kind.
  moe::test::GgufEdit interval;
  interval.drop_key = [](const std::string& k) { return k == "qwen35moe.full_attention_interval"; };
  interval.add_keys = [](moe::gguf::GgufWriter& w) {
    w.set_u32("qwen35moe.full_attention_interval", 2);
  };
  EXPECT_EQ(qwen35_error(interval, "interval"),
            "blk.1.attn_q.weight: required tensor is missing (expected shape 256x512)");
}

// ---- moe-run ----

struct Result {
  int rc = -1;
  std::string err;
};

Result run_tool(const std::string& args) {
  const std::string err_file = tmp_path("stderr") + ".txt";
  const std::string cmd =
      std::string(MOE_BIN_DIR) + "/moe-run " + args + " > /dev/null 2> '" + err_file + "'";
  const int st = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  fs::remove(err_file);
  return r;
}

TEST(MoeRun, UsageAndErrors) {
  EXPECT_EQ(run_tool("").rc, 2);
  EXPECT_EQ(run_tool("--bogus").rc, 2);
  EXPECT_EQ(run_tool("-m x.gguf --tokens-in t -ctk iq4_xs").rc, 2);
  const Result r = run_tool("-m /nonexistent.gguf --tokens-in /nonexistent.i32");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err.rfind("moe-run: error: ", 0), 0u) << r.err;
}

TEST(MoeRun, GreedyAndLogitsFiles) {
  const fs::path root = moe::test::testdata_dir();
  const fs::path dir = root / "golden/tiny-qwen3moe-sv-F16/raw";
  const std::string model = (root / "models/tiny-qwen3moe-sv-F16.gguf").string();
  const std::string toks = tmp_path("toks") + ".i32", logits = tmp_path("logits") + ".f32";
  const std::string common = "-m '" + model + "' -t 2 -ctk f32 -ctv f32 --tokens-in '" +
                             (dir / "prompt_tokens.i32").string() + "' --force-experts '" +
                             dir.string() + "'";
  ASSERT_EQ(run_tool(common + " --logits-out '" + logits + "'").rc, 0);
  const auto got = moe::test::read_raw<float>(logits);
  const auto want = moe::test::read_raw<float>(dir / "prompt_logits.f32");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 0.05) << i;

  // Greedy with forced routing reproduces llama.cpp's tokens; logits are [N, n_vocab].
  ASSERT_EQ(
      run_tool(common + " --greedy 8 --tokens-out '" + toks + "' --logits-out '" + logits + "'").rc,
      0);
  const auto gt = moe::test::read_raw<int32_t>(toks);
  const auto golden = moe::test::read_raw<int32_t>(dir / "greedy_tokens.i32");
  ASSERT_EQ(gt.size(), 8u);
  EXPECT_EQ(gt, std::vector<int32_t>(golden.begin(), golden.begin() + 8));
  EXPECT_EQ(moe::test::read_raw<float>(logits).size(), 8u * 2112u);
  // Too small a context is an error, not a crash.
  const Result r = run_tool(common + " -c 16 --greedy 4");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("context length 16 exceeded"), std::string::npos) << r.err;
  fs::remove(toks);
  fs::remove(logits);
}

}  // namespace
