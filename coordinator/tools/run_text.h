// moe-run's text modes: -p TEXT generation with the sampler chain (streamed through the
// detokenizer) and --apply-template (chat template rendering from the GGUF metadata only).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/gpu/gpu_options.h"
#include "coordinator/sampling/sampler_params.h"
#include "coordinator/tools/kv_cli.h"

namespace moe::tools {

// Sampling flags as typed on the command line (llama.cpp spellings), turned into SamplingParams
// by to_params().
struct SamplingFlags {
  moe::sampling::SamplingParams params;
  int64_t seed = -1;  // -1 = random
  std::string samplers;
  std::vector<std::string> dry_breakers;

  // Registers --temp, --top-k, ..., -s/--seed, --samplers on `app`.
  void add_options(CLI::App& app);
  // Throws moe::Error with SamplingParams::validate()'s message on bad values.
  moe::sampling::SamplingParams to_params() const;
};

struct GenerateArgs {
  std::string model;
  int threads = 1;
  int64_t n_ctx = 0;  // 0 = min(4096, n_ctx_train), at least prompt + n_predict
  KvArgs kv;
  std::string prompt;
  int64_t n_predict = -1;  // -1 = until the context is full
  moe::sampling::SamplingParams sampling;
  moe::gpu::GpuOptions gpu;
};

// Streams the generated text to stdout, timings to stderr. Returns the exit code.
int run_generate(const GenerateArgs& a);

struct TemplateArgs {
  std::string model;
  std::string messages_path, tools_path;
  bool add_generation_prompt = false;
  int enable_thinking = -1;  // -1 unset, 0 false, 1 true
};

// Prints the rendered prompt to stdout exactly (no newline added).
int run_apply_template(const TemplateArgs& a);

}  // namespace moe::tools
