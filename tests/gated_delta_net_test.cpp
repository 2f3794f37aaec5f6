// model::gated_delta_net (the CPU DeltaNet recurrence of qwen35moe) against a double-precision
// scalar reference of its formula on fresh random data: several value heads per key head, head
// sizes that are not multiples of the vector width, batches of one and many tokens, a zero and a
// carried-in state, and thread counts that split the heads' rows differently.
#include "kernels/cpu/gated_delta_net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace moe::model {
namespace {

struct Case {
  int64_t nk, nv, dk, dv, tokens;
  bool carry_state;
  int threads;
};

// S <- exp(g) S; d = beta (v - S k); S <- S + d k^T; o = (S q) / sqrt(dk), per value head h
// reading key head h % nk.
void reference(const Case& c, const std::vector<float>& conv, int64_t stride,
               const std::vector<float>& g, const std::vector<float>& beta,
               const std::vector<float>& state_in, std::vector<double>& state,
               std::vector<double>& out) {
  const int64_t NK = c.nk, NV = c.nv, DK = c.dk, DV = c.dv;
  state.assign(state_in.begin(), state_in.end());
  out.assign(static_cast<size_t>(c.tokens * NV * DV), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(DK));
  for (int64_t t = 0; t < c.tokens; ++t) {
    const float* q = conv.data() + t * stride;
    const float* k = q + NK * DK;
    const float* v = q + 2 * NK * DK;
    for (int64_t h = 0; h < NV; ++h) {
      const int64_t kh = h % NK;
      const double decay = std::exp(static_cast<double>(g[static_cast<size_t>(t * NV + h)]));
      const double b = beta[static_cast<size_t>(t * NV + h)];
      for (int64_t r = 0; r < DV; ++r) {
        double* s = state.data() + (h * DV + r) * DK;
        double sk = 0;
        for (int64_t i = 0; i < DK; ++i) {
          s[i] *= decay;
          sk += s[i] * k[kh * DK + i];
        }
        const double d = b * (v[h * DV + r] - sk);
        double sq = 0;
        for (int64_t i = 0; i < DK; ++i) {
          s[i] += d * k[kh * DK + i];
          sq += s[i] * q[kh * DK + i];
        }
        out[static_cast<size_t>(t * NV * DV + h * DV + r)] = sq * scale;
      }
    }
  }
}

void l2_normalise(float* x, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-12));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

class GatedDeltaNetTest : public ::testing::TestWithParam<Case> {};

TEST_P(GatedDeltaNetTest, MatchesTheReference) {
  const Case c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t NK = c.nk, NV = c.nv, DK = c.dk, DV = c.dv;
  const int64_t stride = 2 * NK * DK + NV * DV + 3;  // padded rows, as the conv output's
  std::vector<float> conv(static_cast<size_t>(c.tokens * stride));
  for (float& x : conv) x = u(rng);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h = 0; h < 2 * NK; ++h) l2_normalise(conv.data() + t * stride + h * DK, DK);
  }
  std::vector<float> g(static_cast<size_t>(c.tokens * NV)), beta(g.size());
  for (float& x : g) x = -0.5f * (u(rng) + 1.0f);  // log-decay in [-1, 0]
  for (float& x : beta) x = 0.5f * (u(rng) + 1.0f);
  std::vector<float> state_in(static_cast<size_t>(NV * DV * DK), 0.0f);
  if (c.carry_state) {
    for (float& x : state_in) x = 0.5f * u(rng);
  }
  std::vector<float> state_out(state_in.size(), 7.0f), out(static_cast<size_t>(c.tokens * NV * DV));
  cpu::ThreadPool pool(c.threads);
  gated_delta_net({NK, NV, DK, DV}, conv.data(), conv.data() + NK * DK, conv.data() + 2 * NK * DK,
                  stride, g.data(), beta.data(), c.tokens,
                  c.carry_state ? state_in.data() : nullptr, state_out.data(), out.data(), pool);
  std::vector<double> ref_state, ref_out;
  reference(c, conv, stride, g, beta, state_in, ref_state, ref_out);
  // F32 accumulation over dk terms per step, compounded over the tokens (measured: below 1e-6
  // on these shapes; a 1e-4 relative change of one factor shows well above the bound).
  const double tol = 2e-6 * std::sqrt(static_cast<double>(c.tokens));
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], ref_out[i], tol * (1.0 + std::abs(ref_out[i]))) << "output " << i;
  }
  for (size_t i = 0; i < state_out.size(); ++i) {
    ASSERT_NEAR(state_out[i], ref_state[i], tol * (1.0 + std::abs(ref_state[i]))) << "state " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaNetTest,
    ::testing::Values(Case{2, 4, 128, 128, 1, true, 4},   // decode: rows split across threads
                      Case{2, 4, 128, 128, 37, true, 3},  // prefill over a carried state
                      Case{1, 3, 24, 20, 9, false, 2},    // sizes off the vector width
                      Case{3, 3, 13, 7, 5, true, 1}, Case{1, 2, 64, 96, 64, false, 2}));

}  // namespace
}  // namespace moe::model
