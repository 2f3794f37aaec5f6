// The one driver of the llama.cpp golden tests (qwen3moe and qwen35moe, CPU and GPU forwards):
// loading a golden folder (Golden, load_golden), recording routing and per-layer tensors through
// ForwardHooks::observe_layer (Recorder), comparing expert sets with the golden ones
// (compare_routing), the teacher-forced run with routing forced to the golden experts and the
// golden rows it lines up with (run_forced, golden_rows, compare_logits), the own-routing and
// free-running greedy runs (run_own, run_free), and all three in the order the CPU golden tests
// check them (run_golden). Thresholds are not here: every test keeps its own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "coordinator/model/model_arch.h"
#include "tests/model/golden_compare.h"

namespace moe::test {

constexpr int64_t kGoldenCtx = 512;  // the context of the golden runs

// Per-layer tensors beyond l_out that some goldens hold (qwen35moe: attn_residual_L.f32,
// moe_logits_L.f32). Asked for, they are required: load_golden reads them (a missing file
// throws) and a Recorder records the prompt batch's (asserting the forward provides them).
struct GoldenExtras {
  bool attn_residual = false;
  bool router_logits = false;
  bool l_out = true;  // l_out_L.f32 (the gpt-oss goldens have none)
};

// One golden folder (model, prompt) of a llama.cpp run: the prompt batch then greedy decode steps.
struct Golden {
  std::filesystem::path dir;
  std::vector<int32_t> prompt, greedy;               // prompt_tokens.i32, greedy_tokens.i32
  std::vector<float> prompt_logits, greedy_logits;   // [row * n_vocab]; greedy row 0 = last prompt
  std::vector<std::vector<int32_t>> topk, gen_topk;  // [layer][row * k], prompt rows / decode steps
  std::vector<std::vector<float>> l_out;             // [layer][prompt row * n_embd]
  std::vector<std::vector<float>> attn_res;          // [layer][prompt row * n_embd]; GoldenExtras
  std::vector<std::vector<float>> router;            // [layer][prompt row * n_expert]; GoldenExtras

  int64_t n_prompt() const { return static_cast<int64_t>(prompt.size()); }
  int64_t n_greedy() const { return static_cast<int64_t>(greedy.size()); }
  // Positions with golden experts: the prompt, then the decode steps gen_topk holds (every greedy
  // token, or all but a final end-of-generation token that was never decoded).
  int64_t n_routed(int64_t k) const {
    return n_prompt() + (gen_topk.empty() ? 0 : static_cast<int64_t>(gen_topk[0].size()) / k);
  }
  // The golden expert ids (k of them) of `layer` at position `pos` (prompt rows, then decode).
  const int32_t* experts(int64_t layer, int64_t pos, int64_t k) const;
};

// Tokens and logits of `dir`; with n_layer > 0 also every layer's expert sets and l_out, plus the
// extras asked for.
Golden load_golden(const std::filesystem::path& dir, int64_t n_layer = 0, GoldenExtras extras = {});

// Per (layer, pos): the experts chosen (or that the router would have chosen) and the probs.
using Choices = std::map<std::pair<int64_t, int64_t>, Choice>;

// Records expert choices (or, `shadow`, the router's own top k) of every (layer, pos) and the
// prompt batch's per-layer tensors (l_out, and the extras asked for) through hooks.observe_layer.
// Not copyable: the hooks point at it.
class Recorder {
 public:
  Recorder(int64_t n_layer, bool shadow, GoldenExtras extras = {});
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  Choices choices;
  std::vector<std::vector<float>> l_out, attn_res, router;  // [layer][prompt row * n]
  model::ForwardHooks hooks;

 private:
  bool shadow_;
  GoldenExtras extras_;
};

// Recorded choices against the golden sets for positions [0, n_pos) (at most g.n_routed(k)).
struct RoutingStats {
  int64_t eq_prompt = 0, n_prompt = 0, eq_decode = 0, n_decode = 0;
  int64_t first_div_pos = INT64_MAX;    // first position with any differing layer
  int64_t mismatches_not_near_tie = 0;  // every mismatch beyond the near-tie gap
  int64_t primary_not_near_tie = 0;     // ... that is not downstream of an earlier one
  double max_gap = 0, primary_gap = 0;  // over all mismatches / those at the first position
  int64_t eq() const { return eq_prompt + eq_decode; }
  int64_t n() const { return n_prompt + n_decode; }
};

// A mismatch whose probability gap (set_gap) is at most `tie` is a near tie.
RoutingStats compare_routing(const Choices& ch, const Golden& g, int64_t n_layer, int64_t k,
                             int64_t n_pos, double tie);

// Logits of every prompt row (one batch) followed by one row per decode step fed steps[0..n).
std::vector<float> teacher_forced(model::ModelArch& m, model::KvCache& cache,
                                  std::span<const int32_t> prompt, std::span<const int32_t> steps,
                                  const model::ForwardHooks* hooks);

// Routing forced to the golden experts, decode teacher-forced on the golden greedy tokens: every
// prompt row, then one row per step that has a golden row (golden_rows' layout). `rec`, if given,
// observes every layer.
std::vector<float> run_forced(model::ModelArch& m, const Golden& g, model::KvType kv,
                              Recorder* rec = nullptr);
// The same from a golden folder.
std::vector<float> run_forced(model::ModelArch& m, const std::filesystem::path& dir,
                              model::KvType kv);
// With any cache configuration (per-layer types, rotation).
std::vector<float> run_forced(model::ModelArch& m, const Golden& g, const model::KvConfig& kv,
                              Recorder* rec = nullptr);

// The cache configurations of ../shared/testdata/golden-kv (folder name, our configuration, the
// README's max / RMS bounds): f16; q8_0 and q4_0 rotated, llama.cpp's default; q4_0 not rotated.
struct GoldenKvFolder {
  const char* name;
  model::KvConfig kv;
  double max, rms;
};
std::vector<GoldenKvFolder> golden_kv_folders();

// prompt_logits then greedy_logits without its row 0 (the last prompt row's, already there).
std::vector<float> golden_rows(const Golden& g);

// run_forced's rows against the goldens: prompt rows against prompt_logits; the last prompt row
// and the decode rows against greedy_logits.
struct LogitDiffs {
  Diff prompt, decode;
};
LogitDiffs compare_logits(const std::vector<float>& rows, const Golden& g);

// Own routing, teacher-forced on every golden greedy token (F32 cache); `rec` observes.
void run_own(model::ModelArch& m, const Golden& g, Recorder& rec);

// Free-running greedy with own routing (F32 cache) for as many steps as the golden run.
struct FreeRun {
  std::vector<int32_t> tokens;
  int64_t agree = 0;       // leading tokens equal to the golden ones
  RoutingStats routing;    // `rec`'s choices over positions [0, n_prompt + agree)
  int64_t must_agree = 0;  // tokens before the first routing divergence (token s comes from
                           // position n_prompt - 1 + s)
  // When agree < must_agree: llama.cpp's logit of its token minus that of ours at `agree`
  // (a near tie of its argmax when small); else -1.
  double argmax_gap = -1;
};
FreeRun run_free(model::ModelArch& m, const Golden& g, Recorder& rec, double tie);

// The three runs of a CPU golden test, in order:
//  1. run_forced, recording the router's own choices (shadow) and the prompt's layer tensors;
//  2. run_own, compared over every position;
//  3. run_free.
struct GoldenRun {
  std::unique_ptr<Recorder> forced;  // 1.: shadow choices, l_out and the extras of the prompt
  LogitDiffs logits;                 // 1.
  RoutingStats shadow;               // 1.: positions [0, n_prompt + n_greedy - 1)
  RoutingStats own;                  // 2.: positions [0, n_prompt + n_greedy)
  FreeRun free;                      // 3.
};
GoldenRun run_golden(model::ModelArch& m, const Golden& g, double tie, GoldenExtras extras = {});

}  // namespace moe::test
