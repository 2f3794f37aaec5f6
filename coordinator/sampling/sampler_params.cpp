#include "coordinator/sampling/sampler_params.h"

#include <cctype>
#include <cmath>
#include <sstream>

#include "common/error.h"

namespace moe::sampling {
namespace {

struct NamedSampler {
  std::string_view name;
  SamplerType type;
};

// Canonical names first (sampler_name returns the first match), then llama.cpp's aliases; names
// are compared after lower-casing and mapping '-' to '_', so "top-k" and "TOP_K" both match.
constexpr NamedSampler kNames[] = {
    {"penalties", SamplerType::kPenalties},
    {"dry", SamplerType::kDry},
    {"top_n_sigma", SamplerType::kTopNSigma},
    {"top_k", SamplerType::kTopK},
    {"typ_p", SamplerType::kTypicalP},
    {"top_p", SamplerType::kTopP},
    {"min_p", SamplerType::kMinP},
    {"xtc", SamplerType::kXtc},
    {"temperature", SamplerType::kTemperature},
    {"typ", SamplerType::kTypicalP},
    {"typical", SamplerType::kTypicalP},
    {"typical_p", SamplerType::kTypicalP},
    {"nucleus", SamplerType::kTopP},
    {"temp", SamplerType::kTemperature},
};

// llama.cpp's one-letter codes for --sampling-seq.
constexpr std::pair<char, SamplerType> kChars[] = {
    {'e', SamplerType::kPenalties}, {'d', SamplerType::kDry},      {'s', SamplerType::kTopNSigma},
    {'k', SamplerType::kTopK},      {'y', SamplerType::kTypicalP}, {'p', SamplerType::kTopP},
    {'m', SamplerType::kMinP},      {'x', SamplerType::kXtc},      {'t', SamplerType::kTemperature},
};

std::string normalize(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '-') c = '_';
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <typename T>
[[noreturn]] void fail(std::string_view param, T value, std::string_view rule) {
  std::ostringstream msg;
  msg << "sampling: " << param << " " << rule << ", got " << value;
  throw Error(msg.str());
}

void require_finite(std::string_view param, float value) {
  if (!std::isfinite(value)) fail(param, value, "must be a finite number");
}

}  // namespace

std::vector<SamplerType> default_sampler_order() {
  return {SamplerType::kPenalties, SamplerType::kDry,      SamplerType::kTopNSigma,
          SamplerType::kTopK,      SamplerType::kTypicalP, SamplerType::kTopP,
          SamplerType::kMinP,      SamplerType::kXtc,      SamplerType::kTemperature};
}

std::vector<SamplerType> parse_sampler_order(std::string_view names) {
  std::vector<SamplerType> order;
  while (true) {
    const size_t sep = names.find(';');
    const std::string_view item = trim(names.substr(0, sep));
    if (!item.empty()) {
      const std::string key = normalize(item);
      bool found = false;
      for (const auto& entry : kNames) {
        if (entry.name == key) {
          order.push_back(entry.type);
          found = true;
          break;
        }
      }
      if (!found) {
        throw Error("sampling: unknown sampler \"" + std::string(item) +
                    "\" in --samplers (known: " + format_sampler_order(default_sampler_order()) +
                    ")");
      }
    }
    if (sep == std::string_view::npos) break;
    names.remove_prefix(sep + 1);
  }
  return order;
}

std::vector<SamplerType> parse_sampler_chars(std::string_view chars) {
  std::vector<SamplerType> order;
  for (char c : chars) {
    bool found = false;
    for (const auto& [code, type] : kChars) {
      if (code == c) {
        order.push_back(type);
        found = true;
        break;
      }
    }
    if (!found) {
      throw Error(std::string("sampling: unknown sampler letter '") + c +
                  "' in --sampling-seq (known: edskypmxt)");
    }
  }
  return order;
}

std::string_view sampler_name(SamplerType type) {
  for (const auto& entry : kNames) {
    if (entry.type == type) return entry.name;
  }
  return "?";
}

std::string format_sampler_order(const std::vector<SamplerType>& order) {
  std::string out;
  for (SamplerType type : order) {
    if (!out.empty()) out += ';';
    out += sampler_name(type);
  }
  return out;
}

void SamplingParams::validate() const {
  // NaN compares false with everything, so every range check below is written to fail on NaN.
  if (logit_bias.size() > kMaxLogitBias) {
    throw Error("sampling: logit_bias has " + std::to_string(logit_bias.size()) +
                " entries, more than " + std::to_string(kMaxLogitBias));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) throw Error("sampling: logit_bias token id " + std::to_string(id) + " is negative");
    if (!(std::isfinite(bias) || bias == -INFINITY)) {
      throw Error("sampling: logit_bias of token " + std::to_string(id) +
                  " must be a number or -inf (a ban)");
    }
  }
  require_finite("temp", temp);
  require_finite("top_p", top_p);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top_p", top_p, "must be in (0, 1]");
  require_finite("min_p", min_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min_p", min_p, "must be in [0, 1]");
  require_finite("typical_p", typical_p);
  if (!(typical_p >= 0.0f && typical_p <= 1.0f)) fail("typical_p", typical_p, "must be in [0, 1]");
  require_finite("top_n_sigma", top_n_sigma);
  require_finite("xtc_probability", xtc_probability);
  if (!(xtc_probability >= 0.0f && xtc_probability <= 1.0f)) {
    fail("xtc_probability", xtc_probability, "must be in [0, 1]");
  }
  require_finite("xtc_threshold", xtc_threshold);
  if (!(xtc_threshold >= 0.0f && xtc_threshold <= 1.0f)) {
    fail("xtc_threshold", xtc_threshold, "must be in [0, 1]");
  }
  if (min_keep < 0) fail("min_keep", min_keep, "must be >= 0");
  if (repeat_last_n < -1) fail("repeat_last_n", repeat_last_n, "must be >= -1");
  require_finite("repeat_penalty", repeat_penalty);
  if (!(repeat_penalty > 0.0f)) fail("repeat_penalty", repeat_penalty, "must be > 0");
  require_finite("presence_penalty", presence_penalty);
  require_finite("frequency_penalty", frequency_penalty);
  require_finite("dry_multiplier", dry_multiplier);
  if (!(dry_multiplier >= 0.0f)) fail("dry_multiplier", dry_multiplier, "must be >= 0");
  require_finite("dry_base", dry_base);
  if (!(dry_base >= 1.0f)) fail("dry_base", dry_base, "must be >= 1");
  if (dry_allowed_length < 0) fail("dry_allowed_length", dry_allowed_length, "must be >= 0");
  if (dry_penalty_last_n < -1) fail("dry_penalty_last_n", dry_penalty_last_n, "must be >= -1");
  for (SamplerType type : order) {
    if (static_cast<int>(type) < 0 ||
        static_cast<int>(type) > static_cast<int>(SamplerType::kTemperature)) {
      fail("samplers", static_cast<int>(type), "contains an unknown sampler id");
    }
  }
}

}  // namespace moe::sampling
