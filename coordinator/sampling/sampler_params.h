// Sampling parameters with llama.cpp's names, defaults and meanings, plus the sampler order
// parsed from llama.cpp's `--samplers` / `--sampling-seq` syntax.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moe::sampling {

// One transform of the candidate list; the chain applies them in SamplingParams::order.
enum class SamplerType {
  kPenalties,    // "penalties"   repetition / presence / frequency
  kDry,          // "dry"         don't-repeat-yourself n-gram penalty
  kTopNSigma,    // "top_n_sigma"
  kTopK,         // "top_k"
  kTypicalP,     // "typ_p"       locally typical sampling
  kTopP,         // "top_p"       nucleus
  kMinP,         // "min_p"
  kXtc,          // "xtc"         exclude top choices
  kTemperature,  // "temperature"
};

// llama.cpp's default order: "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature".
std::vector<SamplerType> default_sampler_order();

// Parses llama.cpp's `--samplers` list: names separated by ';' (canonical names and aliases such as
// "top-k", "typical", "typical_p", "nucleus", "temp"; '-' and '_' are interchangeable, case is
// ignored, empty entries are skipped). Unknown names throw moe::Error (llama.cpp skips them).
std::vector<SamplerType> parse_sampler_order(std::string_view names);

// Parses llama.cpp's `--sampling-seq` letters, e.g. "edskypmxt" (the default order).
std::vector<SamplerType> parse_sampler_chars(std::string_view chars);

// Canonical llama.cpp name of one sampler ("top_k", "typ_p", ...).
std::string_view sampler_name(SamplerType type);

// The order written back as a `--samplers` string.
std::string format_sampler_order(const std::vector<SamplerType>& order);

// The most logit_bias entries a request may carry (checked before anything walks them).
inline constexpr size_t kMaxLogitBias = 4096;

// llama.cpp's LLAMA_DEFAULT_SEED: draw a random seed at construction.
inline constexpr uint32_t kRandomSeed = 0xFFFFFFFFu;

struct SamplingParams {
  uint32_t seed = kRandomSeed;  // kRandomSeed (-1 on llama.cpp's command line) = random
  int32_t min_keep = 0;         // the probability filters keep at least this many tokens (0 = 1)

  float temp = 0.8f;          // <= 0: greedy (argmax, ties to the lowest token id)
  int32_t top_k = 40;         // <= 0: off
  float top_p = 0.95f;        // 1: off
  float min_p = 0.05f;        // 0: off
  float typical_p = 1.0f;     // 1: off
  float top_n_sigma = -1.0f;  // <= 0: off

  float xtc_probability = 0.0f;  // 0: off
  float xtc_threshold = 0.1f;    // > 0.5: off (two tokens cannot both exceed it)

  int32_t repeat_last_n = 64;      // window of accepted tokens; 0: off, -1: everything since reset
  float repeat_penalty = 1.0f;     // 1: off
  float presence_penalty = 0.0f;   // 0: off
  float frequency_penalty = 0.0f;  // 0: off

  float dry_multiplier = 0.0f;  // 0: off
  float dry_base = 1.75f;
  int32_t dry_allowed_length = 2;
  int32_t dry_penalty_last_n = -1;  // 0: off, -1: everything since reset
  std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};

  std::vector<SamplerType> order = default_sampler_order();

  // Added to these tokens' logits before the chain; -inf bans a token (logit_bias). Ids are
  // checked against the vocabulary by the Sampler.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Throws moe::Error naming the first invalid parameter and its value.
  void validate() const;
};

}  // namespace moe::sampling
