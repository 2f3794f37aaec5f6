// moe-run: loads a GGUF model and evaluates token ids: logits of a prompt batch (--tokens-in
// --logits-out) or greedy decoding with the KV cache (--greedy). The model and generation loop
// live in moe_model; this file only parses arguments and moves bytes. Text modes (-p TEXT with the
// sampler chain, --apply-template) are in run_text.cpp.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/gpu/gpu_cli.h"
#include "coordinator/gpu/model_factory.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/model/speculative.h"
#include "coordinator/tools/kv_cli.h"
#include "coordinator/tools/llama_cli_args.h"
#include "coordinator/tools/run_text.h"
#include "coordinator/tools/spec_cli.h"
#include "kernels/cpu/thread_pool.h"

namespace {

struct Args {
  std::string model;
  int threads = 0;
  int64_t n_ctx = 0;
  moe::tools::KvArgs kv;
  std::string tokens_in, logits_out, tokens_out, force_dir;
  int64_t greedy = -1;
  moe::tools::SpecArgs spec;  // --greedy with drafts verified in batches
  // Text modes.
  std::string prompt, apply_template, tools;
  int64_t n_predict = -1;
  bool has_prompt = false;
  bool add_generation_prompt = false, no_thinking = false, thinking = false;
  moe::tools::SamplingFlags sampling;
  moe::gpu::GpuOptions gpu;
};

int resolve_threads(int t) {
  return t > 0 ? t : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

template <typename T>
std::vector<T> read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw moe::Error("cannot open " + path);
  const auto bytes = static_cast<size_t>(f.tellg());
  if (bytes % sizeof(T) != 0)
    throw moe::Error(path + ": size is not a multiple of " + std::to_string(sizeof(T)));
  std::vector<T> v(bytes / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
  if (!f) throw moe::Error("cannot read " + path);
  return v;
}

template <typename T>
void write_raw(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
  if (!f) throw moe::Error("cannot write " + path);
}

int run_text(const Args& a) {
  if (!a.apply_template.empty()) {
    moe::tools::TemplateArgs t;
    t.model = a.model;
    t.messages_path = a.apply_template;
    t.tools_path = a.tools;
    t.add_generation_prompt = a.add_generation_prompt;
    if (a.no_thinking) t.enable_thinking = 0;
    if (a.thinking) t.enable_thinking = 1;
    return moe::tools::run_apply_template(t);
  }
  moe::tools::GenerateArgs g;
  g.sampling = a.sampling.to_params();  // bad values fail before the model loads
  g.model = a.model;
  g.threads = resolve_threads(a.threads);
  g.n_ctx = a.n_ctx;
  g.kv = a.kv;
  g.prompt = a.prompt;
  g.n_predict = a.n_predict;
  g.gpu = a.gpu;
  return moe::tools::run_generate(g);
}

int run(const Args& a) {
  using namespace moe::model;
  if (!a.apply_template.empty() || a.has_prompt) return run_text(a);
  const auto file = moe::gpu::open_model(a.gpu, a.model, "moe-run");
  moe::gpu::GpuOptions gpu = a.gpu;
  moe::cpu::ThreadPool pool(
      moe::gpu::cpu_pool_threads(gpu, resolve_threads(a.threads)), {},
      gpu.n_gpu_layers > 0 ? moe::gpu::kGpuPoolSpin : moe::cpu::ThreadPool::kDefaultSpin);
  if (a.n_ctx > 0) gpu.n_ctx = a.n_ctx;
  gpu.kv = moe::tools::kv_config(a.kv);
  std::string placement;
  auto model = moe::gpu::create_model(file, pool, nullptr, gpu, &placement);
  if (gpu.n_gpu_layers > 0) std::fprintf(stderr, "moe-run: %s\n", placement.c_str());
  const ModelConfig& cfg = model->config();
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx : std::min<int64_t>(4096, cfg.n_ctx_train);
  KvCache cache = model->make_cache(n_ctx, moe::tools::kv_config(a.kv));

  const std::vector<int32_t> prompt = read_raw<int32_t>(a.tokens_in);
  if (prompt.empty()) throw moe::Error(a.tokens_in + ": no tokens");
  std::optional<ForcedRouting> forced;
  ForwardHooks hooks;
  if (!a.force_dir.empty()) {
    forced.emplace(a.force_dir, cfg.n_layer, cfg.n_expert_used);
    if (forced->n_prompt() != static_cast<int64_t>(prompt.size())) {
      throw moe::Error(a.force_dir + ": routing is for " + std::to_string(forced->n_prompt()) +
                       " prompt tokens, the input has " + std::to_string(prompt.size()));
    }
    hooks = forced->hooks();
  }
  const ForwardHooks* hp = forced ? &hooks : nullptr;

  if (a.greedy < 0) {
    const std::vector<float> logits = evaluate_batch(*model, cache, prompt, hp);
    if (!a.logits_out.empty()) write_raw(a.logits_out, logits);
    std::printf("moe-run: evaluated %zu tokens, logits [%zu, %lld]\n", prompt.size(), prompt.size(),
                static_cast<long long>(cfg.n_vocab));
    return 0;
  }
  GenerateOptions opt;
  opt.n_steps = a.greedy;
  opt.keep_logits = !a.logits_out.empty();
  opt.hooks = hp;
  GenerateResult res;
  if (a.spec.type == "ngram" && gpu.n_gpu_layers > 0) {
    // The GPU's one-row and batched kernels sum in different orders, so a verified draft could
    // differ from what one-token decoding picks; the CPU's kernels are row-invariant.
    throw moe::Error("--spec-type ngram runs on the CPU only for now (-ngl 0)");
  }
  if (a.spec.type == "ngram") {
    SpeculativeStats st;
    res = generate_speculative(*model, cache, prompt, opt,
                               moe::tools::make_drafter(a.spec, *model, cache.n_ctx()), &st);
    std::fprintf(stderr, "moe-run: speculative (n-gram): %s\n", describe(st).c_str());
  } else {
    res = generate(*model, cache, prompt, opt);
  }
  if (!a.tokens_out.empty()) write_raw(a.tokens_out, res.tokens);
  if (!a.logits_out.empty()) write_raw(a.logits_out, res.logits);
  std::printf("moe-run: prompt %zu tokens, generated %zu:", prompt.size(), res.tokens.size());
  for (int32_t t : res.tokens) std::printf(" %d", t);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> argv_s;
  std::vector<char*> argv_p = moe::tools::llama_style_argv(argc, argv, argv_s);

  CLI::App app{"Evaluate a MoE GGUF model: token ids, text generation or chat templates"};
  Args a;
  app.add_option("-m,--model", a.model, "GGUF model file")->required();
  app.add_option("-t,--threads", a.threads, "threads (default: hardware threads)")
      ->check(CLI::Range(1, 1024));
  app.add_option("-c,--ctx-size", a.n_ctx, "context length (default: min(4096, n_ctx_train))")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  moe::tools::add_kv_options(app, a.kv);
  auto* tokens_in = app.add_option("--tokens-in", a.tokens_in, "prompt token ids (raw int32)");
  auto* prompt = app.add_option("-p,--prompt", a.prompt, "generate text after this prompt");
  auto* apply = app.add_option("--apply-template", a.apply_template,
                               "print the chat template rendered for these messages (JSON array)");
  prompt->excludes(tokens_in);
  apply->excludes(tokens_in)->excludes(prompt);
  app.add_option("-n,--n-predict", a.n_predict,
                 "tokens to generate with -p (-1: until context full)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 24));
  a.sampling.add_options(app);
  moe::gpu::add_gpu_options(app, a.gpu);
  app.add_option("--tools", a.tools, "--apply-template: tool definitions (JSON array)");
  app.add_flag("--add-generation-prompt", a.add_generation_prompt,
               "--apply-template: end with the assistant turn's opening");
  auto* no_think =
      app.add_flag("--no-thinking", a.no_thinking, "--apply-template: enable_thinking = false");
  app.add_flag("--thinking", a.thinking, "--apply-template: enable_thinking = true")
      ->excludes(no_think);
  app.add_option("--logits-out", a.logits_out,
                 "float32 logits: every prompt row, or every greedy step");
  app.add_option("--greedy", a.greedy, "decode N greedy tokens with the KV cache")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--tokens-out", a.tokens_out, "greedy token ids (raw int32)");
  moe::tools::add_spec_options(app, a.spec, "--greedy");
  app.add_option("--force-experts", a.force_dir,
                 "golden run folder: use its moe_topk_L / gen_moe_topk_L experts");
  try {
    app.parse(static_cast<int>(argv_p.size()), argv_p.data());
    a.has_prompt = prompt->count() > 0;
    if (tokens_in->count() == 0 && !a.has_prompt && apply->count() == 0)
      throw CLI::ValidationError("one of --tokens-in, -p or --apply-template is required");
    if (!a.tokens_out.empty() && a.greedy < 0)
      throw CLI::ValidationError("--tokens-out needs --greedy N");
    if (a.spec.type != "none" && a.greedy < 0)
      throw CLI::ValidationError("--spec-type needs --greedy N");
    moe::tools::check_spec_args(a.spec);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-run: error: %s\n", e.what());
    return 1;
  }
}
