// The KV cache flags every tool and the server share, as llama.cpp and the reference user's fork
// spell them: -ctk/-ctv for every layer, -ctk-first/-ctk-last/-ctv-first/-ctv-last TYPE,N for the
// first/last N attention layers, --no-kv-rotation, and ik_llama.cpp's --k-cache-hadamard /
// --v-cache-hadamard (rotation is already the default; accepted so those command lines run), and
// llama.cpp's --swa-full.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common/error.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/tools/llama_cli_args.h"

namespace moe::tools {

struct KvArgs {
  std::string ctk = "f16", ctv = "f16";
  std::string k_first, k_last, v_first, v_last;  // TYPE,N; empty: not given
  bool no_rotation = false;
  bool k_hadamard = false, v_hadamard = false;
  bool swa_full = false;
};

inline void add_kv_options(CLI::App& app, KvArgs& a) {
  app.add_option("--cache-type-k", a.ctk,
                 "K cache type (-ctk): f32|f16|bf16|q8_0|q5_0|q5_1|q4_0|q4_1|iq4_nl")
      ->check(CLI::IsMember(kKvCacheTypes));
  app.add_option("--cache-type-v", a.ctv,
                 "V cache type (-ctv): f32|f16|bf16|q8_0|q5_0|q5_1|q4_0|q4_1|iq4_nl")
      ->check(CLI::IsMember(kKvCacheTypes));
  app.add_option("--cache-type-k-first", a.k_first,
                 "-ctk-first TYPE,N: the first N attention layers' K cache type");
  app.add_option("--cache-type-k-last", a.k_last,
                 "-ctk-last TYPE,N: the last N attention layers' K cache type");
  app.add_option("--cache-type-v-first", a.v_first,
                 "-ctv-first TYPE,N: the first N attention layers' V cache type");
  app.add_option("--cache-type-v-last", a.v_last,
                 "-ctv-last TYPE,N: the last N attention layers' V cache type");
  app.add_flag("--no-kv-rotation", a.no_rotation,
               "store quantized K/V as they are (default: Hadamard-rotated, as llama.cpp)");
  app.add_flag("--k-cache-hadamard", a.k_hadamard,
               "rotate quantized K rows (the default; for ik_llama.cpp command lines)");
  app.add_flag("--v-cache-hadamard", a.v_hadamard,
               "rotate quantized V rows (the default; for ik_llama.cpp command lines)");
  app.add_flag("--swa-full", a.swa_full,
               "sliding-window layers (gpt-oss) keep every position, as llama.cpp's --swa-full "
               "(default: their window + 512, and the prompt cache resumes from checkpoints)");
}

// moe::Error naming the flag for a bad TYPE,N or contradicting flags.
inline model::KvConfig kv_config(const KvArgs& a) {
  model::KvConfig c =
      model::KvConfig::uniform(model::parse_kv_type(a.ctk), model::parse_kv_type(a.ctv));
  const auto over = [](const std::string& spec, const char* flag) {
    return spec.empty() ? std::nullopt : std::optional(model::KvConfig::parse_override(spec, flag));
  };
  c.k_first = over(a.k_first, "-ctk-first");
  c.k_last = over(a.k_last, "-ctk-last");
  c.v_first = over(a.v_first, "-ctv-first");
  c.v_last = over(a.v_last, "-ctv-last");
  if (a.no_rotation && (a.k_hadamard || a.v_hadamard)) {
    throw Error("--no-kv-rotation contradicts --k-cache-hadamard / --v-cache-hadamard");
  }
  c.rotate = !a.no_rotation;
  c.swa_full = a.swa_full;
  return c;
}

}  // namespace moe::tools
