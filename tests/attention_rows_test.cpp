// cpu::attend_rows (the CPU prompt attention) against its double-precision reference on fresh
// random data: row counts and position counts that are not multiples of the tile (64), unequal
// head dims, strided K/V rows, rows that see different prefixes (causal), one row alone, and
// scores large enough that a missing max subtraction would overflow; sliding windows (rows that
// see only their last positions, starting inside a tile or tiles after the first) and attention
// sinks (gpt-oss), alone and together, with sinks both below and far above the scores.
#include "kernels/cpu/attention_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace moe::cpu {
namespace {

struct Case {
  int64_t rows, n_kv, hd_k, hd_v, stride_pad;
  float q_scale;
  int64_t window = 0;       // > 0: row r sees its last `window` positions only
  float sink_scale = 0.0f;  // > 0: per-row sinks uniform in [-1, 1] * sink_scale
};

class AttendRowsTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttendRowsTest, MatchesTheReference) {
  const Case c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t ks = c.hd_k + c.stride_pad, vs = c.hd_v + c.stride_pad;
  std::vector<float> q(static_cast<size_t>(c.rows * c.hd_k)), k(static_cast<size_t>(c.n_kv * ks)),
      v(static_cast<size_t>(c.n_kv * vs));
  for (float& x : q) x = u(rng) * c.q_scale;
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  // Causal: the last row sees every position, earlier rows a prefix ending up to rows-1 earlier;
  // rows come in groups of 4 that see the same positions, as the heads of one token do.
  std::vector<int64_t> n_vis(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    n_vis[static_cast<size_t>(r)] = std::max<int64_t>(1, c.n_kv - (c.rows - 1 - r) / 4);
  }
  std::vector<int64_t> first(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    first[static_cast<size_t>(r)] = std::max<int64_t>(0, n_vis[static_cast<size_t>(r)] - c.window);
  }
  std::vector<float> sinks(static_cast<size_t>(c.rows));
  for (float& x : sinks) x = u(rng) * c.sink_scale;
  AttendRows a;
  if (c.window > 0) a.first_vis = first.data();
  if (c.sink_scale > 0) a.sinks = sinks.data();
  a.q = q.data();
  a.n_rows = c.rows;
  a.n_vis = n_vis.data();
  a.k = k.data();
  a.v = v.data();
  a.k_stride = ks;
  a.v_stride = vs;
  a.hd_k = c.hd_k;
  a.hd_v = c.hd_v;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd_k));
  std::vector<float> got(static_cast<size_t>(c.rows * c.hd_v), NAN), want(got.size(), NAN);
  a.out = got.data();
  AttendRowsScratch scratch;
  attend_rows(a, scratch);
  a.out = want.data();
  attend_rows_ref(a);
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "at " << i;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
  // The scratch is reused (steady state): the same call gives the same bits.
  std::vector<float> again(got.size());
  a.out = again.data();
  attend_rows(a, scratch);
  EXPECT_EQ(again, got);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttendRowsTest,
    ::testing::Values(Case{64, 64, 128, 128, 0, 1.0f}, Case{72, 1000, 128, 128, 384, 1.0f},
                      Case{1, 7, 64, 64, 0, 1.0f}, Case{33, 130, 96, 64, 32, 1.0f},
                      Case{64, 300, 256, 256, 0, 1.0f}, Case{40, 200, 128, 128, 0, 40.0f},
                      // Sliding windows: inside one tile, across tiles, longer than the prefix.
                      Case{32, 150, 64, 64, 0, 1.0f, 8}, Case{33, 700, 64, 64, 16, 1.0f, 100},
                      Case{8, 20, 64, 64, 0, 1.0f, 128},
                      // Sinks: comparable to the scores, dominating them, with a window.
                      Case{40, 90, 64, 64, 0, 1.0f, 0, 2.0f},
                      Case{16, 70, 64, 64, 0, 1.0f, 0, 30.0f},
                      Case{48, 260, 64, 64, 8, 4.0f, 8, 3.0f}));

}  // namespace
}  // namespace moe::cpu
