#include "coordinator/sampling/sampler_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "tests/sampling/test_util.h"

namespace moe::sampling {
namespace {

using test::contains;
using test::error_of;
using T = SamplerType;

TEST(SamplingParams, DefaultsMatchLlamaCpp) {
  const SamplingParams p;
  EXPECT_EQ(p.temp, 0.8f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.typical_p, 1.0f);
  EXPECT_EQ(p.top_n_sigma, -1.0f);
  EXPECT_EQ(p.xtc_probability, 0.0f);
  EXPECT_EQ(p.xtc_threshold, 0.1f);
  EXPECT_EQ(p.repeat_penalty, 1.0f);
  EXPECT_EQ(p.repeat_last_n, 64);
  EXPECT_EQ(p.presence_penalty, 0.0f);
  EXPECT_EQ(p.frequency_penalty, 0.0f);
  EXPECT_EQ(p.dry_multiplier, 0.0f);
  EXPECT_EQ(p.dry_base, 1.75f);
  EXPECT_EQ(p.dry_allowed_length, 2);
  EXPECT_EQ(p.dry_penalty_last_n, -1);
  EXPECT_EQ(p.dry_sequence_breakers, (std::vector<std::string>{"\n", ":", "\"", "*"}));
  EXPECT_EQ(p.min_keep, 0);
  EXPECT_EQ(p.seed, kRandomSeed);
  EXPECT_EQ(format_sampler_order(p.order),
            "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature");
  EXPECT_NO_THROW(p.validate());
}

TEST(SamplerOrder, ParsesDefaultString) {
  EXPECT_EQ(
      parse_sampler_order("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"),
      default_sampler_order());
}

TEST(SamplerOrder, AcceptsAliasesCaseAndSpaces) {
  const std::vector<T> expected = {T::kTopK,        T::kTypicalP,    T::kTypicalP,  T::kTypicalP,
                                   T::kTypicalP,    T::kTopP,        T::kTopP,      T::kMinP,
                                   T::kTemperature, T::kTemperature, T::kTopNSigma, T::kXtc};
  EXPECT_EQ(parse_sampler_order("top-k;typ_p;typical_p;typical;typ-p;top-p;nucleus;min-p;temp;"
                                " TEMPERATURE ;top-n-sigma;xtc"),
            expected);
}

TEST(SamplerOrder, KeepsOrderAndDuplicatesSkipsEmpty) {
  EXPECT_EQ(parse_sampler_order("temperature;;top_k;temperature;"),
            (std::vector<T>{T::kTemperature, T::kTopK, T::kTemperature}));
  EXPECT_TRUE(parse_sampler_order("").empty());
}

TEST(SamplerOrder, UnknownNameIsAnError) {
  const std::string msg = error_of([] { parse_sampler_order("top_k;top_q;temp"); });
  EXPECT_TRUE(contains(msg, "\"top_q\"")) << msg;
  EXPECT_TRUE(contains(error_of([] { parse_sampler_order("infill"); }), "infill"));
}

TEST(SamplerOrder, ParsesSamplingSeqLetters) {
  EXPECT_EQ(parse_sampler_chars("edskypmxt"), default_sampler_order());
  EXPECT_EQ(parse_sampler_chars("tk"), (std::vector<T>{T::kTemperature, T::kTopK}));
  EXPECT_TRUE(contains(error_of([] { parse_sampler_chars("kz"); }), "'z'"));
}

TEST(SamplerOrder, NamesRoundTrip) {
  const std::vector<T> order = {T::kXtc, T::kMinP, T::kTypicalP, T::kDry, T::kPenalties};
  EXPECT_EQ(format_sampler_order(order), "xtc;min_p;typ_p;dry;penalties");
  EXPECT_EQ(parse_sampler_order(format_sampler_order(order)), order);
}

struct BadCase {
  std::function<void(SamplingParams&)> set;
  std::string param;
  std::string value;
};

TEST(SamplingParams, ValidateNamesBadParameterAndValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<BadCase> cases = {
      {[&](SamplingParams& p) { p.temp = nan; }, "temp", "nan"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p", "0"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p", "1.5"},
      {[&](SamplingParams& p) { p.top_p = nan; }, "top_p", "nan"},
      {[](SamplingParams& p) { p.min_p = -0.25f; }, "min_p", "-0.25"},
      {[](SamplingParams& p) { p.min_p = 1.25f; }, "min_p", "1.25"},
      {[](SamplingParams& p) { p.typical_p = 2.0f; }, "typical_p", "2"},
      {[&](SamplingParams& p) { p.top_n_sigma = nan; }, "top_n_sigma", "nan"},
      {[](SamplingParams& p) { p.xtc_probability = 1.5f; }, "xtc_probability", "1.5"},
      {[](SamplingParams& p) { p.xtc_threshold = -0.5f; }, "xtc_threshold", "-0.5"},
      {[](SamplingParams& p) { p.min_keep = -1; }, "min_keep", "-1"},
      {[](SamplingParams& p) { p.repeat_last_n = -2; }, "repeat_last_n", "-2"},
      {[](SamplingParams& p) { p.repeat_penalty = 0.0f; }, "repeat_penalty", "0"},
      {[&](SamplingParams& p) { p.presence_penalty = nan; }, "presence_penalty", "nan"},
      {[](SamplingParams& p) { p.frequency_penalty = INFINITY; }, "frequency_penalty", "inf"},
      {[](SamplingParams& p) { p.dry_multiplier = -1.0f; }, "dry_multiplier", "-1"},
      {[](SamplingParams& p) { p.dry_base = 0.5f; }, "dry_base", "0.5"},
      {[](SamplingParams& p) { p.dry_allowed_length = -3; }, "dry_allowed_length", "-3"},
      {[](SamplingParams& p) { p.dry_penalty_last_n = -7; }, "dry_penalty_last_n", "-7"},
  };
  for (const BadCase& c : cases) {
    SamplingParams p;
    c.set(p);
    const std::string msg = error_of([&] { p.validate(); });
    EXPECT_TRUE(contains(msg, c.param + " ")) << msg;
    EXPECT_TRUE(contains(msg, "got " + c.value)) << msg;
  }
}

TEST(SamplingParams, GreedyAndDisabledValuesAreValid) {
  SamplingParams p;
  p.temp = -1.0f;  // llama.cpp: temp <= 0 is greedy
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.xtc_threshold = 0.9f;
  p.repeat_last_n = -1;
  p.order.clear();
  EXPECT_NO_THROW(p.validate());
}

}  // namespace
}  // namespace moe::sampling
