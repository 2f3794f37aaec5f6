#include "coordinator/tools/run_text.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/chat_template/chat_template.h"
#include "coordinator/gpu/model_factory.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/sampling/sampler.h"
#include "coordinator/tokenizer/stream_detokenizer.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::tools {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void print_timing(const char* what, double ms, int64_t n, const char* unit) {
  const double per = n > 0 ? ms / static_cast<double>(n) : 0.0;
  const double tps = ms > 0 ? 1e3 * static_cast<double>(n) / ms : 0.0;
  std::fprintf(stderr,
               "moe-run: %-18s = %10.2f ms / %5lld %s (%8.2f ms per token, %8.2f tokens per "
               "second)\n",
               what, ms, static_cast<long long>(n), unit, per, tps);
}

nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw moe::Error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw moe::Error(path + ": invalid JSON: " + e.what());
  }
}

}  // namespace

void SamplingFlags::add_options(CLI::App& app) {
  auto& p = params;
  app.add_option("--temp", p.temp, "temperature (<= 0: greedy)");
  app.add_option("--top-k", p.top_k, "top-k sampling (<= 0: off)");
  app.add_option("--top-p", p.top_p, "top-p sampling (1: off)");
  app.add_option("--min-p", p.min_p, "min-p sampling (0: off)");
  app.add_option("--typical", p.typical_p, "locally typical sampling p (1: off)");
  app.add_option("--top-nsigma", p.top_n_sigma, "top-n-sigma sampling (<= 0: off)");
  app.add_option("--xtc-probability", p.xtc_probability, "XTC probability (0: off)");
  app.add_option("--xtc-threshold", p.xtc_threshold, "XTC threshold (> 0.5: off)");
  app.add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1: off)");
  app.add_option("--repeat-last-n", p.repeat_last_n, "penalty window (0: off, -1: context)");
  app.add_option("--presence-penalty", p.presence_penalty, "presence penalty (0: off)");
  app.add_option("--frequency-penalty", p.frequency_penalty, "frequency penalty (0: off)");
  app.add_option("--dry-multiplier", p.dry_multiplier, "DRY multiplier (0: off)");
  app.add_option("--dry-base", p.dry_base, "DRY base");
  app.add_option("--dry-allowed-length", p.dry_allowed_length, "DRY allowed length");
  app.add_option("--dry-penalty-last-n", p.dry_penalty_last_n, "DRY window (0: off, -1: context)");
  app.add_option("--dry-sequence-breaker", dry_breakers,
                 "DRY sequence breaker (repeatable; replaces the defaults; 'none' for none)")
      ->allow_extra_args(false);
  app.add_option("-s,--seed", seed, "RNG seed (-1: random)");
  app.add_option("--samplers", samplers, "sampler order, e.g. \"top_k;top_p;temperature\"");
  app.add_option("--min-keep", p.min_keep, "minimum tokens the filters keep");
}

moe::sampling::SamplingParams SamplingFlags::to_params() const {
  moe::sampling::SamplingParams p = params;
  if (seed < -1 || seed > static_cast<int64_t>(UINT32_MAX))
    throw moe::Error("seed: " + std::to_string(seed) + " is out of range [-1, 4294967295]");
  p.seed = seed == -1 ? moe::sampling::kRandomSeed : static_cast<uint32_t>(seed);
  if (!samplers.empty()) p.order = moe::sampling::parse_sampler_order(samplers);
  if (!dry_breakers.empty()) {
    p.dry_sequence_breakers.clear();
    for (const std::string& b : dry_breakers)
      if (b != "none") p.dry_sequence_breakers.push_back(b);
  }
  p.validate();
  return p;
}

int run_generate(const GenerateArgs& a) {
  using namespace moe::model;
  const auto file = moe::gpu::open_model(a.gpu, a.model, "moe-run");
  const auto tok = moe::tokenizer::Tokenizer::from_gguf(file);
  std::vector<int32_t> prompt;
  if (tok.add_bos() && tok.bos_id() >= 0) prompt.push_back(tok.bos_id());
  const std::vector<int32_t> text_ids = tok.encode(a.prompt, /*parse_special=*/true);
  prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());
  if (prompt.empty()) throw moe::Error("the prompt is empty");

  moe::gpu::GpuOptions gpu = a.gpu;
  moe::cpu::ThreadPool pool(
      moe::gpu::cpu_pool_threads(gpu, a.threads), {},
      gpu.n_gpu_layers > 0 ? moe::gpu::kGpuPoolSpin : moe::cpu::ThreadPool::kDefaultSpin);
  if (a.n_ctx > 0) gpu.n_ctx = a.n_ctx;
  gpu.kv = kv_config(a.kv);
  std::string placement;
  auto model = moe::gpu::create_model(file, pool, nullptr, gpu, &placement);
  if (gpu.n_gpu_layers > 0) std::fprintf(stderr, "%s\n", placement.c_str());
  const ModelConfig& cfg = model->config();
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  int64_t n_ctx = a.n_ctx;
  if (n_ctx <= 0) {
    n_ctx = std::min<int64_t>(4096, cfg.n_ctx_train);
    if (a.n_predict >= 0) n_ctx = std::max(n_ctx, n_prompt + a.n_predict);
  }
  if (n_prompt > n_ctx) {
    throw moe::Error("the prompt has " + std::to_string(n_prompt) +
                     " tokens, more than the context (" + std::to_string(n_ctx) + ")");
  }
  KvCache cache = model->make_cache(n_ctx, kv_config(a.kv));
  // The last chosen token is not decoded, so n tokens need n_prompt + n - 1 positions.
  const int64_t room = n_ctx - n_prompt + 1;
  const int64_t n_steps = a.n_predict < 0 ? room : std::min(a.n_predict, room);

  moe::sampling::DryVocab dry_vocab;
  dry_vocab.piece = [&tok](int32_t id) { return tok.token_piece(id, true); };
  dry_vocab.tokenize = [&tok](std::string_view s) { return tok.encode(s, true); };
  moe::sampling::Sampler sampler(a.sampling, tok.n_vocab(), &dry_vocab);
  for (int32_t t : prompt) sampler.accept(t);
  std::fprintf(stderr, "moe-run: prompt %lld tokens, seed %u, context %lld\n",
               static_cast<long long>(n_prompt), sampler.seed(), static_cast<long long>(n_ctx));

  moe::tokenizer::StreamDetokenizer detok(tok);
  const Clock::time_point t_start = Clock::now();
  std::optional<Clock::time_point> t_prompt_done;
  int64_t n_sampled = 0;
  GenerateOptions opt;
  opt.n_steps = n_steps;
  opt.pick = [&](std::span<const float> logits) {
    if (!t_prompt_done) t_prompt_done = Clock::now();
    ++n_sampled;
    return sampler.sample(logits);
  };
  opt.on_token = [&](int32_t t) {
    sampler.accept(t);
    if (tok.is_eog(t)) return false;
    const std::string text = detok.push(t);
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  generate(*model, cache, prompt, opt);
  const Clock::time_point t_end = Clock::now();
  const std::string tail = detok.finish();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fflush(stdout);

  const Clock::time_point t_pp = t_prompt_done.value_or(t_end);
  std::fprintf(stderr, "\n");
  print_timing("prompt eval time", ms_between(t_start, t_pp), n_prompt, "tokens");
  // Every sampled token but the first was produced by one single-token decode.
  print_timing("eval time", ms_between(t_pp, t_end), std::max<int64_t>(0, n_sampled - 1), "runs  ");
  print_timing("total time", ms_between(t_start, t_end), n_prompt + n_sampled, "tokens");
  return 0;
}

int run_apply_template(const TemplateArgs& a) {
  const auto file = moe::gguf::GgufFile::open(a.model);
  const auto tok = moe::tokenizer::Tokenizer::from_gguf(file);
  const moe::ChatTemplate tmpl(std::string(file.require_string("tokenizer.chat_template")));
  moe::ChatTemplateInputs in;
  in.messages = read_json(a.messages_path);
  if (!in.messages.is_array())
    throw moe::Error(a.messages_path + ": expected a JSON array of messages");
  if (!a.tools_path.empty()) {
    in.tools = read_json(a.tools_path);
    if (!in.tools.is_array() && !in.tools.is_null())
      throw moe::Error(a.tools_path + ": expected a JSON array of tools");
  }
  in.add_generation_prompt = a.add_generation_prompt;
  if (a.enable_thinking >= 0) in.enable_thinking = a.enable_thinking == 1;
  if (tok.bos_id() >= 0) in.bos_token = std::string(tok.vocab().text(tok.bos_id()));
  if (tok.eos_id() >= 0) in.eos_token = std::string(tok.vocab().text(tok.eos_id()));
  const std::string out = tmpl.render(in);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace moe::tools
