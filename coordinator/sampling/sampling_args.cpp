#include "coordinator/sampling/sampling_args.h"

#include <string>

namespace moe::sampling {

namespace {

using Params = moe::v1::SamplingParams;

constexpr const char* kGroup = "Sampling";

// An option that calls `set` on the params with its value when given.
template <typename T>
void add(CLI::App& app, Params& p, const std::string& name, void (Params::*set)(T),
         const std::string& help) {
  app.add_option_function<T>(
         name, [&p, set](const T& v) { (p.*set)(v); }, help)
      ->group(kGroup);
}

}  // namespace

void SamplingArgs::add_options(CLI::App& app) {
  Params& p = params_;
  add(app, p, "--temp", &Params::set_temperature, "temperature (<= 0: greedy)");
  add(app, p, "--top-k", &Params::set_top_k, "top-k sampling (<= 0: off)");
  add(app, p, "--top-p", &Params::set_top_p, "top-p sampling (1: off)");
  add(app, p, "--min-p", &Params::set_min_p, "min-p sampling (0: off)");
  add(app, p, "--typical", &Params::set_typical_p, "locally typical sampling p (1: off)");
  add(app, p, "--top-nsigma", &Params::set_top_n_sigma, "top-n-sigma sampling (<= 0: off)");
  add(app, p, "--xtc-probability", &Params::set_xtc_probability, "XTC probability (0: off)");
  add(app, p, "--xtc-threshold", &Params::set_xtc_threshold, "XTC threshold (> 0.5: off)");
  add(app, p, "--repeat-penalty", &Params::set_repeat_penalty, "repetition penalty (1: off)");
  add(app, p, "--repeat-last-n", &Params::set_repeat_last_n,
      "penalty window (0: off, -1: context)");
  add(app, p, "--presence-penalty", &Params::set_presence_penalty, "presence penalty (0: off)");
  add(app, p, "--frequency-penalty", &Params::set_frequency_penalty, "frequency penalty (0: off)");
  add(app, p, "--dry-multiplier", &Params::set_dry_multiplier, "DRY multiplier (0: off)");
  add(app, p, "--dry-base", &Params::set_dry_base, "DRY base");
  add(app, p, "--dry-allowed-length", &Params::set_dry_allowed_length, "DRY allowed length");
  add(app, p, "--dry-penalty-last-n", &Params::set_dry_penalty_last_n,
      "DRY window (0: off, -1: context)");
  add(app, p, "--min-keep", &Params::set_min_keep, "minimum tokens the filters keep");
  app.add_option_function<std::string>(
         "--samplers", [&p](const std::string& v) { p.set_samplers(v); },
         "sampler order, e.g. \"top_k;top_p;min_p;temperature\"")
      ->group(kGroup);
  app.add_option_function<int64_t>(
         "-s,--seed",
         [this](const int64_t& v) {
           if (v == -1)
             seed_.reset();
           else
             seed_ = static_cast<uint32_t>(v);
         },
         "RNG seed (-1: random)")
      ->check(CLI::Range(int64_t{-1}, int64_t{UINT32_MAX}))
      ->group(kGroup);
}

void SamplingArgs::apply(moe::v1::GenerateRequest& req) const {
  *req.mutable_sampling() = params_;
  if (seed_) req.set_seed(*seed_);
}

}  // namespace moe::sampling
