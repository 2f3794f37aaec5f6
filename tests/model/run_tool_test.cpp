// moe-run's text modes (-p generation, --apply-template) and moe-bench, run as processes on the
// shared test data: chat template renders byte-exact against the Qwen3 golden cases, greedy text
// matches llama.cpp's greedy tokens, seeded sampling is reproducible, errors exit with the right
// codes, and moe-bench prints its table and JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/tokenizer/stream_detokenizer.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const std::string kBin = MOE_BIN_DIR;

struct Proc {
  int rc = -1;
  std::string out;
};

// Runs `cmd` through the shell; stdout captured (stderr too when `with_stderr`).
Proc run(const std::string& cmd, bool with_stderr = false) {
  Proc p;
  FILE* f = popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!f) return p;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  const int st = pclose(f);
  p.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return p;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

fs::path tmp_dir() {
  const fs::path d = fs::temp_directory_path() / ("moe_run_tool_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

fs::path f16_model() { return moe::test::testdata_dir() / "models" / "tiny-qwen3moe-sv-F16.gguf"; }

std::string moe_run() { return quote(kBin + "/moe-run") + " -m " + quote(f16_model().string()); }

TEST(RunTool, ApplyTemplateMatchesQwen3Golden) {
  const fs::path golden = moe::test::testdata_dir() / "golden" / "chat" / "qwen3.jsonl";
  std::ifstream in(golden);
  ASSERT_TRUE(in) << golden;
  const fs::path dir = tmp_dir();
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const ordered_json j = ordered_json::parse(line);
    write_text(dir / "msgs.json", j.at("messages").dump());
    std::string cmd = moe_run() + " --apply-template " + quote((dir / "msgs.json").string());
    if (j.contains("tools") && !j.at("tools").is_null()) {
      write_text(dir / "tools.json", j.at("tools").dump());
      cmd += " --tools " + quote((dir / "tools.json").string());
    }
    if (j.at("add_generation_prompt").get<bool>()) cmd += " --add-generation-prompt";
    if (j.contains("enable_thinking"))
      cmd += j.at("enable_thinking").get<bool>() ? " --thinking" : " --no-thinking";
    const Proc p = run(cmd);
    EXPECT_EQ(p.rc, 0) << j.at("name");
    EXPECT_EQ(p.out, j.at("rendered").get<std::string>()) << j.at("name");
    ++n;
  }
  EXPECT_EQ(n, 30);
}

TEST(RunTool, ApplyTemplateRejectsBadMessages) {
  const fs::path dir = tmp_dir();
  write_text(dir / "bad.json", "[{\"role\": ");
  Proc p = run(moe_run() + " --apply-template " + quote((dir / "bad.json").string()), true);
  EXPECT_EQ(p.rc, 1);
  EXPECT_NE(p.out.find("bad.json"), std::string::npos) << p.out;
  write_text(dir / "obj.json", "{\"role\": \"user\"}");
  p = run(moe_run() + " --apply-template " + quote((dir / "obj.json").string()), true);
  EXPECT_EQ(p.rc, 1);
  EXPECT_NE(p.out.find("obj.json"), std::string::npos) << p.out;
}

// -p TEXT with --temp 0 prints exactly the text of the greedy token ids that --tokens-in --greedy
// produces for the golden prompt tokens (so tokenization with parse_special, the sampler's greedy
// path and the streamed detokenization agree), and those ids start with llama.cpp's greedy tokens.
// The chat prompt must match llama.cpp from the first token; on the raw prompt the F16 model's
// routing meets a near tie inside the prompt (golden_test.cpp), so the first token may differ.
void check_greedy_text(const std::string& prompt_name, size_t min_golden_match) {
  const fs::path td = moe::test::testdata_dir();
  const fs::path gdir = td / "golden" / "tiny-qwen3moe-sv-F16" / prompt_name;
  const std::string prompt = read_text(td / "golden" / "prompts" / (prompt_name + ".txt"));
  ASSERT_FALSE(prompt.empty());
  const auto golden = moe::test::read_raw<int32_t>(gdir / "greedy_tokens.i32");
  constexpr int kSteps = 8;
  ASSERT_GE(golden.size(), static_cast<size_t>(kSteps));

  const fs::path dir = tmp_dir();
  const Proc ids =
      run(moe_run() + " -t 2 -ctk f32 -ctv f32 --tokens-in " +
          quote((gdir / "prompt_tokens.i32").string()) + " --greedy " + std::to_string(kSteps) +
          " --tokens-out " + quote((dir / "greedy.i32").string()));
  ASSERT_EQ(ids.rc, 0);
  const auto ours = moe::test::read_raw<int32_t>(dir / "greedy.i32");
  ASSERT_EQ(ours.size(), static_cast<size_t>(kSteps));
  size_t k = 0;
  while (k < ours.size() && ours[k] == golden[k]) ++k;
  EXPECT_GE(k, min_golden_match) << "greedy tokens leave llama.cpp's too early";

  const Proc p = run(moe_run() + " -t 2 -ctk f32 -ctv f32 -p " + quote(prompt) + " -n " +
                     std::to_string(kSteps) + " --temp 0");
  ASSERT_EQ(p.rc, 0);
  const auto file = moe::gguf::GgufFile::open(f16_model().string());
  const auto tok = moe::tokenizer::Tokenizer::from_gguf(file);
  moe::tokenizer::StreamDetokenizer detok(tok);
  std::string want;
  for (int32_t t : ours) {
    if (tok.is_eog(t)) break;
    want += detok.push(t);
  }
  want += detok.finish();
  EXPECT_FALSE(p.out.empty());
  EXPECT_EQ(p.out, want);
}

TEST(RunTool, GreedyTextMatchesGoldenChat) { check_greedy_text("chat", 1); }
TEST(RunTool, GreedyTextMatchesOwnGreedyRaw) { check_greedy_text("raw", 0); }

TEST(RunTool, SeededSamplingIsReproducible) {
  const std::string cmd = moe_run() + " -t 2 -p 'Once upon a time' -n 16 --temp 0.8 -s 42";
  const Proc a = run(cmd);
  const Proc b = run(cmd);
  ASSERT_EQ(a.rc, 0);
  ASSERT_EQ(b.rc, 0);
  EXPECT_FALSE(a.out.empty());
  EXPECT_EQ(a.out, b.out);
  // All sampling flags parse and DRY builds its breakers from the vocabulary.
  const Proc c =
      run(moe_run() +
              " -t 2 -p 'Hello' -n 8 --temp 0.7 --top-k 20 --top-p 0.9 --min-p 0.02 "
              "--typical 0.95 --top-nsigma 2 --xtc-probability 0.5 --xtc-threshold 0.2 "
              "--repeat-penalty 1.1 --repeat-last-n 32 --presence-penalty 0.1 "
              "--frequency-penalty 0.1 --dry-multiplier 0.8 --dry-base 1.75 "
              "--dry-allowed-length 2 --dry-penalty-last-n 64 --dry-sequence-breaker x "
              "--dry-sequence-breaker '\n' -s 7 --samplers 'penalties;dry;top_k;temperature' "
              "--min-keep 1",
          true);
  EXPECT_EQ(c.rc, 0) << c.out;
}

TEST(RunTool, UsageAndValueErrors) {
  Proc p = run(moe_run() + " -p hi --top-p 2", true);
  EXPECT_EQ(p.rc, 1);
  EXPECT_NE(p.out.find("moe-run: error: sampling: top_p"), std::string::npos) << p.out;
  p = run(moe_run() + " -p hi --samplers 'top_k;bogus'", true);
  EXPECT_EQ(p.rc, 1);
  EXPECT_NE(p.out.find("moe-run: error:"), std::string::npos) << p.out;
  p = run(moe_run() + " -p hi --tokens-in /nonexistent.i32", true);
  EXPECT_EQ(p.rc, 2) << p.out;
  p = run(moe_run(), true);
  EXPECT_EQ(p.rc, 2) << p.out;
  // GPU placement flags without -ngl would silently do nothing: refused with the reason.
  for (const char* flag :
       {"-cmoe", "--vram-budget-mib 6144", "--moe-profile /tmp/unused-profile.json",
        "--moe-stream-share auto", "--moe-prefill-cpu-share 0.5", "--moe-resident-grouping layout",
        "--recalibrate"}) {
    p = run(moe_run() + " -p hi -n 1 " + flag, true);
    EXPECT_EQ(p.rc, 1) << flag << ": " << p.out;
    EXPECT_NE(p.out.find("need -ngl"), std::string::npos) << flag << ": " << p.out;
  }
  // --moe-stream-share takes auto or a number in [0, 1]; the profiler old or new.
  for (const char* bad : {"1.5", "-0.1", "0.3x", "half"}) {
    p = run(moe_run() + " -p hi -n 1 --moe-stream-share " + bad, true);
    EXPECT_EQ(p.rc, 2) << bad << ": " << p.out;
    EXPECT_NE(p.out.find("neither auto nor a number in [0, 1]"), std::string::npos) << p.out;
  }
  p = run(moe_run() + " -p hi -n 1 --moe-prefill-cpu-share 2", true);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("--moe-prefill-cpu-share"), std::string::npos) << p.out;
  p = run(moe_run() + " -p hi -n 1 --moe-resident-profiler newest", true);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("--moe-resident-profiler"), std::string::npos) << p.out;
  p = run(moe_run() + " -p hi -n 1 --moe-resident-grouping contiguous", true);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("--moe-resident-grouping"), std::string::npos) << p.out;
}

// --spec-type ngram: greedy tokens with n-gram drafts verified in batches are the plain greedy
// tokens; the flags are checked.
TEST(RunTool, SpeculativeGreedyGivesTheSameTokens) {
  const fs::path dir = tmp_dir();
  const fs::path prompt = dir / "spec_prompt.i32";
  std::vector<int32_t> ids;
  for (int r = 0; r < 3; ++r) {
    for (int32_t t : {11, 305, 42, 7, 1999, 64}) ids.push_back(t);
  }
  write_text(prompt, std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  const std::string base =
      moe_run() + " -t 2 --tokens-in " + quote(prompt.string()) + " --greedy 24 --tokens-out ";
  const fs::path plain = dir / "plain.i32", spec = dir / "spec.i32";
  ASSERT_EQ(run(base + quote(plain.string())).rc, 0);
  const Proc p = run(base + quote(spec.string()) + " --spec-type ngram --draft-max 4", true);
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_NE(p.out.find("moe-run: speculative (n-gram): "), std::string::npos) << p.out;
  EXPECT_EQ(read_text(spec), read_text(plain));
  EXPECT_EQ(read_text(plain).size(), 24u * 4u);
  EXPECT_EQ(run(moe_run() + " --tokens-in " + quote(prompt.string()) + " --spec-type ngram").rc, 2);
  EXPECT_EQ(run(base + quote(spec.string()) + " --spec-type medusa").rc, 2);
  EXPECT_EQ(run(base + quote(spec.string()) + " --spec-type ngram --spec-ngram-min 4").rc, 2);
  EXPECT_EQ(run(base + quote(spec.string()) + " --spec-type ngram --draft-max 0").rc, 2);
}

TEST(RunTool, BenchPrintsTableAndJson) {
  const fs::path dir = tmp_dir();
  const fs::path model = dir / "synth.gguf";
  ASSERT_EQ(run(quote(kBin + "/moe-synth") + " --preset tiny -o " + quote(model.string())).rc, 0);
  const std::string bench =
      quote(kBin + "/moe-bench") + " -m " + quote(model.string()) + " -p 16 -n 4 -r 2 -t 2";
  const Proc md = run(bench);
  ASSERT_EQ(md.rc, 0);
  for (const std::string test : {"pp16", "tg4"}) {
    const size_t at = md.out.find("| " + test + " | ");
    ASSERT_NE(at, std::string::npos) << md.out;
    const double ts = std::stod(md.out.substr(at + test.size() + 5));
    EXPECT_GT(ts, 0.0) << md.out;
  }
  const Proc js = run(bench + " -o json");
  ASSERT_EQ(js.rc, 0);
  const auto j = nlohmann::json::parse(js.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0].at("test"), "pp16");
  EXPECT_EQ(j[1].at("test"), "tg4");
  EXPECT_GT(j[0].at("median_ts").get<double>(), 0.0);
  EXPECT_GT(j[1].at("median_ts").get<double>(), 0.0);
  // -mmp 0 (llama-bench's flag) reads the model into memory and says how much is in huge pages.
  const Proc loaded = run(bench + " -mmp 0", true);
  ASSERT_EQ(loaded.rc, 0) << loaded.out;
  EXPECT_NE(loaded.out.find("model read into memory"), std::string::npos) << loaded.out;
  EXPECT_NE(loaded.out.find("| tg4 | "), std::string::npos) << loaded.out;
  EXPECT_NE(run(bench + " -mmp 2", true).rc, 0);
  // -d: llama-bench's depth, a test per depth with the cache filled first; quantized, per-layer
  // and rotated caches through the shared KV flags.
  const Proc deep = run(bench + " -d 0,40 -ctk q4_0 -ctv q4_0 -ctv-first q8_0,1 -o json");
  ASSERT_EQ(deep.rc, 0) << deep.out;
  const auto d = nlohmann::json::parse(deep.out);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[2].at("test"), "pp16 @ d40");
  EXPECT_EQ(d[3].at("test"), "tg4 @ d40");
  EXPECT_EQ(d[3].at("n_depth"), 40);
  EXPECT_GT(d[3].at("median_ts").get<double>(), 0.0);
  EXPECT_NE(run(bench + " -d -5", true).rc, 0);
  EXPECT_NE(run(bench + " -ctv-first q8_0", true).rc, 0);
  // -c sizes the cache beyond what the tests need, and the start-up line gives its layout and
  // bytes at that length: a q4_0 cache is 18/64 of an f16 one (tiny preset: 8 KV rows of 128
  // values per layer and side).
  const auto kv_mib = [&](const std::string& type) {
    const Proc p = run(quote(kBin + "/moe-bench") + " -m " + quote(model.string()) +
                           " -p 0 -n 1 -r 1 -t 2 -c 65536 -ctk " + type + " -ctv " + type,
                       true);
    EXPECT_EQ(p.rc, 0) << p.out;
    const size_t at = p.out.find("moe-bench: KV cache: ");
    const size_t mib = p.out.find(" MiB for 65536 positions", at);
    if (at == std::string::npos || mib == std::string::npos) {
      ADD_FAILURE() << p.out;
      return 0.0;
    }
    return std::stod(p.out.substr(p.out.rfind(' ', mib - 1) + 1));
  };
  const double f16_mib = kv_mib("f16"), q4_mib = kv_mib("q4_0");
  EXPECT_GT(f16_mib, 0.0);
  EXPECT_NEAR(q4_mib / f16_mib, 18.0 / 64.0, 0.01);
  const Proc short_ctx = run(bench + " -c 8", true);
  EXPECT_EQ(short_ctx.rc, 1) << short_ctx.out;
  EXPECT_NE(short_ctx.out.find("-c 8 is shorter than the 20 positions"), std::string::npos)
      << short_ctx.out;
  // --spec-type ngram: greedy decoding without and with drafts, a row each, the drafts' counts
  // and whether the tokens agreed (on the CPU they must); it does not combine with -d or -npl.
  const std::string spec_bench = quote(kBin + "/moe-bench") + " -m " + quote(model.string()) +
                                 " -p 16 -r 2 -t 2 --spec-type ngram";
  const Proc spec = run(spec_bench + " -n 24 --draft-max 4", true);
  ASSERT_EQ(spec.rc, 0) << spec.out;
  EXPECT_NE(spec.out.find("| tg24 greedy | "), std::string::npos) << spec.out;
  EXPECT_NE(spec.out.find("| tg24 spec ngram | "), std::string::npos) << spec.out;
  EXPECT_NE(spec.out.find("moe-bench: tg24 spec ngram: "), std::string::npos) << spec.out;
  EXPECT_NE(spec.out.find("| tg24 spec ngram priced | "), std::string::npos) << spec.out;
  EXPECT_NE(spec.out.find("moe-bench: tg24 spec ngram priced: cost model: acceptance "),
            std::string::npos)
      << spec.out;
  EXPECT_NE(spec.out.find("the same tokens as without drafts: yes"), std::string::npos) << spec.out;
  EXPECT_EQ(run(spec_bench + " -d 0,8", true).rc, 2);
  EXPECT_EQ(run(spec_bench + " -npl 2", true).rc, 2);
  EXPECT_EQ(run(spec_bench + " -n 1", true).rc, 2);
  EXPECT_EQ(run(spec_bench + " --spec-ngram-min 5", true).rc, 2);
  // --spec-drafts-fail: random drafted tokens are rejected (a random id is the greedy choice
  // about once in n_vocab), and the tokens are still the plain greedy ones.
  const Proc fail = run(spec_bench + " -n 24 --draft-max 4 --spec-drafts-fail", true);
  ASSERT_EQ(fail.rc, 0) << fail.out;
  const size_t whole = fail.out.find("moe-bench: tg24 spec ngram: ");
  ASSERT_NE(whole, std::string::npos) << fail.out;
  const std::string line = fail.out.substr(whole, fail.out.find('\n', whole) - whole);
  EXPECT_NE(line.find(" 0 accepted (0.0%)"), std::string::npos) << line;
  EXPECT_EQ(line.find(" 0 drafted"), std::string::npos) << line;
  EXPECT_NE(line.find("the same tokens as without drafts: yes"), std::string::npos) << line;
  EXPECT_EQ(run(quote(kBin + "/moe-bench") + " -m " + quote(model.string()) +
                    " -p 16 -n 8 --spec-drafts-fail",
                true)
                .rc,
            2);
  // --spec-drafts-accept P: the greedy run's own tokens as drafts, each kept with probability
  // P: all accepted at 1, none at 0, in between about P of the first token of each draft; the
  // tokens are always the plain greedy ones.
  const auto accepted_share = [&](const char* p) {
    const Proc r = run(spec_bench + " -n 40 --draft-max 4 --spec-drafts-accept " + p, true);
    EXPECT_EQ(r.rc, 0) << r.out;
    const size_t at = r.out.find("moe-bench: tg40 spec ngram: ");
    EXPECT_NE(at, std::string::npos) << r.out;
    const std::string l = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(l.find("the same tokens as without drafts: yes"), std::string::npos) << l;
    const size_t pct = l.find("%)");
    const size_t open = pct == std::string::npos ? pct : l.rfind('(', pct);
    EXPECT_NE(open, std::string::npos) << l;
    return open == std::string::npos ? -1.0 : std::stod(l.substr(open + 1, pct - open - 1));
  };
  EXPECT_EQ(accepted_share("1"), 100.0);
  EXPECT_EQ(accepted_share("0"), 0.0);
  EXPECT_EQ(run(spec_bench + " -n 8 --spec-drafts-accept 1.5", true).rc, 2);
  EXPECT_EQ(run(spec_bench + " -n 8 --spec-drafts-accept 0.5 --spec-drafts-fail", true).rc, 2);
  // --op-profile: a table of the CPU forward's ops per test, after the results.
  const Proc ops = run(bench + " --op-profile");
  ASSERT_EQ(ops.rc, 0) << ops.out;
  for (const std::string test : {"pp16", "tg4"}) {
    const size_t at = ops.out.find("ops of " + test + ", 2 threads:");
    ASSERT_NE(at, std::string::npos) << ops.out;
    EXPECT_NE(ops.out.find("| router + routed experts | ", at), std::string::npos) << ops.out;
  }
}

}  // namespace
