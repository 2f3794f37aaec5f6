#include "coordinator/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace moe::sampling {
namespace {

uint32_t resolve_seed(uint32_t seed) {
  if (seed != kRandomSeed) return seed;
  std::random_device rd;
  return static_cast<uint32_t>(rd());
}

// splitmix64 finaliser: derives an independent stream's seed from the user's seed.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 53 bits. The engine's output sequence is fixed by the standard,
// unlike std::uniform_real_distribution's mapping, so draws are the same on every platform.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

SamplingParams validated(SamplingParams p) {
  p.validate();
  return p;
}

DryBreakers make_breakers(const SamplingParams& p, int32_t n_vocab, const DryVocab* vocab) {
  const bool dry_on = p.dry_multiplier > 0.0f && p.dry_penalty_last_n != 0;
  bool any = false;
  for (const std::string& s : p.dry_sequence_breakers) any = any || !s.empty();
  if (!dry_on || !any) return {};
  if (vocab == nullptr) {
    throw Error(
        "sampling: dry_sequence_breakers need the tokenizer's vocabulary (pass a DryVocab), or "
        "clear them");
  }
  return DryBreakers::build(p.dry_sequence_breakers, n_vocab, *vocab);
}

}  // namespace

Sampler::Sampler(SamplingParams params, int32_t n_vocab, const DryVocab* vocab)
    : params_(validated(std::move(params))),
      n_vocab_(n_vocab > 0
                   ? n_vocab
                   : throw Error("sampling: n_vocab must be > 0, got " + std::to_string(n_vocab))),
      seed_(resolve_seed(params_.seed)),
      min_keep_(static_cast<size_t>(params_.min_keep)),
      penalties_(params_.repeat_last_n, params_.repeat_penalty, params_.frequency_penalty,
                 params_.presence_penalty, n_vocab),
      dry_(params_, n_vocab, make_breakers(params_, n_vocab, vocab)) {
  cands_.items.reserve(static_cast<size_t>(n_vocab));
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= n_vocab) {
      throw Error("sampling: logit_bias token id " + std::to_string(id) +
                  " is outside the vocabulary (" + std::to_string(n_vocab) + " tokens)");
    }
    if (bias_.empty()) bias_.assign(static_cast<size_t>(n_vocab), 0.0f);
    bias_[static_cast<size_t>(id)] += bias;
  }
  if (params_.typical_p < 1.0f) {
    scratch_.key.reserve(static_cast<size_t>(n_vocab));
    scratch_.index.reserve(static_cast<size_t>(n_vocab));
    scratch_.items.reserve(static_cast<size_t>(n_vocab));
  }
  reset();
}

void Sampler::reset() {
  penalties_.reset();
  dry_.reset();
  rng_.seed(seed_);
  xtc_rng_.seed(mix(seed_));
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_) {
    throw Error("sampling: accepted token " + std::to_string(token) +
                " is outside the vocabulary (" + std::to_string(n_vocab_) + " tokens)");
  }
  penalties_.accept(token);
  dry_.accept(token);
}

void Sampler::fill(std::span<const float> logits, std::span<const uint64_t> allowed) {
  if (logits.size() != static_cast<size_t>(n_vocab_)) {
    throw Error("sampling: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                std::to_string(n_vocab_));
  }
  if (!allowed.empty() && allowed.size() != (logits.size() + 63) / 64) {
    throw Error("sampling: a token mask of " + std::to_string(allowed.size()) +
                " words for a vocabulary of " + std::to_string(n_vocab_));
  }
  cands_.items.resize(logits.size());
  size_t n = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!allowed.empty() && ((allowed[i / 64] >> (i % 64)) & 1u) == 0) continue;
    const float l = bias_.empty() ? logits[i] : logits[i] + bias_[i];
    // -inf marks a banned token: dropping it now keeps every later step's arithmetic finite.
    if (l == -INFINITY) continue;
    if (!std::isfinite(l)) {
      throw Error("sampling: logit of token " + std::to_string(i) + " is " + std::to_string(l));
    }
    cands_.items[n++] = Candidate{static_cast<int32_t>(i), l, 0.0f};
  }
  if (n == 0) {
    throw Error(allowed.empty() ? "sampling: every logit is -inf, no token can be sampled"
                                : "sampling: the grammar allows no token that has a finite logit");
  }
  cands_.items.resize(n);
  cands_.sorted = false;
}

void Sampler::set_logprobs(int n_top) {
  if (n_top < -1 || n_top > kMaxTopLogprobs) {
    throw Error("sampling: top_logprobs = " + std::to_string(n_top) + " is outside 0.." +
                std::to_string(kMaxTopLogprobs));
  }
  n_top_logprobs_ = n_top;
}

void Sampler::start_logprobs() {
  float max_logit = -INFINITY;
  for (const Candidate& c : cands_.items) max_logit = std::max(max_logit, c.logit);
  double sum = 0.0;
  for (const Candidate& c : cands_.items) sum += std::exp(static_cast<double>(c.logit - max_logit));
  log_sum_exp_ = max_logit + std::log(sum);
  // The top n by ranks_before without disturbing the candidates: a partial sort of a copy of
  // only the few that can make it (n is at most 20).
  const size_t n = std::min(static_cast<size_t>(n_top_logprobs_), cands_.size());
  std::vector<Candidate> best(cands_.items.begin(), cands_.items.begin() + static_cast<long>(n));
  std::make_heap(best.begin(), best.end(), ranks_before);  // worst of the best at the front
  for (size_t i = n; i < cands_.size() && n > 0; ++i) {
    if (ranks_before(cands_.items[i], best.front())) {
      std::pop_heap(best.begin(), best.end(), ranks_before);
      best.back() = cands_.items[i];
      std::push_heap(best.begin(), best.end(), ranks_before);
    }
  }
  std::sort_heap(best.begin(), best.end(), ranks_before);
  logprobs_.top.clear();
  for (const Candidate& c : best) {
    logprobs_.top.push_back({c.id, static_cast<float>(c.logit - log_sum_exp_)});
  }
}

void Sampler::finish_logprobs(int32_t token, std::span<const float> logits) {
  const auto i = static_cast<size_t>(token);
  const float l = bias_.empty() ? logits[i] : logits[i] + bias_[i];
  logprobs_.token = {token, static_cast<float>(l - log_sum_exp_)};
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const uint64_t> allowed) {
  fill(logits, allowed);
  if (n_top_logprobs_ >= 0) start_logprobs();
  const int32_t token = run_chain();
  if (n_top_logprobs_ >= 0) finish_logprobs(token, logits);
  return token;
}

int32_t Sampler::run_chain() {
  for (SamplerType step : params_.order) {
    switch (step) {
      case SamplerType::kPenalties:
        penalties_.apply(cands_);
        break;
      case SamplerType::kDry:
        dry_.apply(cands_);
        break;
      case SamplerType::kTopNSigma:
        apply_top_n_sigma(cands_, params_.top_n_sigma);
        break;
      case SamplerType::kTopK:
        apply_top_k(cands_, params_.top_k);
        break;
      case SamplerType::kTypicalP:
        apply_typical(cands_, params_.typical_p, min_keep_, scratch_);
        break;
      case SamplerType::kTopP:
        apply_top_p(cands_, params_.top_p, min_keep_);
        break;
      case SamplerType::kMinP:
        apply_min_p(cands_, params_.min_p, min_keep_);
        break;
      case SamplerType::kXtc:
        // The roll happens only when XTC could act, as in llama.cpp.
        if (params_.xtc_probability > 0.0f && params_.xtc_threshold <= 0.5f && cands_.size() >= 2 &&
            uniform01(xtc_rng_) < params_.xtc_probability) {
          apply_xtc(cands_, params_.xtc_threshold, min_keep_);
        }
        break;
      case SamplerType::kTemperature:
        apply_temperature(cands_, params_.temp);
        break;
    }
  }
  return draw();
}

int32_t Sampler::draw() {
  // temp <= 0 is greedy even when "temperature" is not in the order.
  if (params_.temp <= 0.0f) apply_temperature(cands_, params_.temp);
  softmax(cands_);
  if (cands_.size() == 1) return cands_.items[0].id;
  double total = 0.0;
  for (const Candidate& x : cands_.items) total += x.p;
  const double target = uniform01(rng_) * total;
  double mass = 0.0;
  for (const Candidate& x : cands_.items) {
    mass += x.p;
    if (mass > target) return x.id;
  }
  // Rounding left target at the very top: the last token with any probability.
  for (size_t i = cands_.size(); i-- > 0;) {
    if (cands_.items[i].p > 0.0f) return cands_.items[i].id;
  }
  return cands_.items[argmax(cands_)].id;
}

}  // namespace moe::sampling
