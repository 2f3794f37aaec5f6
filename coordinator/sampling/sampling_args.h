// Sampler flags with llama.cpp's spellings (as moe-run's SamplingFlags) turned into the
// moe.v1.SamplingParams of a GenerateRequest. Only the flags given are set; the others stay unset
// so that the server applies llama.cpp's defaults. Values are not range-checked here: the server
// validates requests.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>

#include "moe/v1/generation.pb.h"

namespace moe::sampling {

class SamplingArgs {
 public:
  SamplingArgs() = default;
  SamplingArgs(const SamplingArgs&) = delete;  // the options registered write into this object
  SamplingArgs& operator=(const SamplingArgs&) = delete;

  // Registers --temp, --top-k, --top-p, --min-p, --typical, --top-nsigma, --xtc-probability,
  // --xtc-threshold, --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty,
  // --dry-multiplier, --dry-base, --dry-allowed-length, --dry-penalty-last-n, --min-keep,
  // --samplers and -s/--seed on `app`, listed under "Sampling" in the help.
  void add_options(CLI::App& app);

  // The sampler settings given on the command line.
  const moe::v1::SamplingParams& params() const { return params_; }
  // -s/--seed; unset when not given or -1 (the server draws one and reports it in Finish).
  std::optional<uint32_t> seed() const { return seed_; }
  // Copies params() and seed() into `req`.
  void apply(moe::v1::GenerateRequest& req) const;

 private:
  moe::v1::SamplingParams params_;
  std::optional<uint32_t> seed_;
};

}  // namespace moe::sampling
