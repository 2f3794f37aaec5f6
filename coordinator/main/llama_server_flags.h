// The flags of a llama-server command line that moe-coordinator takes as they are: server-wide
// sampling defaults (--temp, --top-k, ..., --samplers, -s, -n), -np, -ub, --jinja, -fa,
// --no-context-shift, --metrics, --mlock and --moe-resident. Flags whose feature does not exist
// yet (context shift) are declared too, so that
// they fail with one line saying so instead of "not expected" or, worse, being ignored.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "coordinator/sampling/sampling_args.h"

namespace moe::server {

struct LlamaServerFlags {
  sampling::SamplingArgs sampling;  // defaults for what a request leaves unset
  int32_t n_predict = -1;           // -n: tokens at most when a request sets no limit; -1: none
  int n_parallel = 1;               // -np
  int64_t ubatch = 0;               // -ub: tokens per forward (0: -b's)
  std::string flash_attn = "auto";  // -fa: accepted; our attention is always flash-style
  bool mlock = false;
  std::string moe_resident = "auto";  // off: no VRAM pool of CPU-homed experts
  std::string unsupported;            // the first flag given whose feature does not exist yet
};

// Declares the flags on `app` (multi-letter short names such as -np, -ub, -fa, -ctk-first come
// through tools::llama_style_argv).
void add_llama_server_flags(CLI::App& app, LlamaServerFlags& f);

// Throws moe::Error naming the first flag that cannot be honoured.
void check_llama_server_flags(const LlamaServerFlags& f);

}  // namespace moe::server
