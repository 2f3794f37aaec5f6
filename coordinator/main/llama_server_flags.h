// The flags of a llama-server command line that moe-coordinator takes as they are: server-wide
// sampling defaults (--temp, --top-k, ..., --samplers, -s, -n), -np, -ub, --jinja, -fa,
// --context-shift / --no-context-shift, --metrics, --mlock, --moe-resident and --slot-save-path.
// A flag whose feature does not exist yet would be declared too (`unsupported`), so that it
// fails with one line saying so instead of "not expected" or, worse, being ignored; none is now.
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
  bool context_shift = false;         // --context-shift (off: --no-context-shift, the default)
  std::string moe_resident = "auto";  // off: no VRAM pool of CPU-homed experts
  std::string slot_save_path;         // POST /slots/{id} save/restore files; empty: off
  std::string unsupported;            // the first flag given whose feature does not exist yet
};

// Declares the flags on `app` (multi-letter short names such as -np, -ub, -fa, -ctk-first come
// through tools::llama_style_argv).
void add_llama_server_flags(CLI::App& app, LlamaServerFlags& f);

// Throws moe::Error naming the first flag that cannot be honoured; creates --slot-save-path's
// folder when it does not exist (as llama-server does).
void check_llama_server_flags(const LlamaServerFlags& f);

}  // namespace moe::server
