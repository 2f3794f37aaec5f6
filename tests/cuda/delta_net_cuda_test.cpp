// The qwen35moe linear-attention kernels (causal conv1d, L2 norm of heads, gated DeltaNet) and the
// small qwen35moe ops against the CPU implementations in coordinator/model/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/causal_conv.h"
#include "kernels/cpu/gated_delta_net.h"
#include "kernels/cpu/l2norm.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/delta_net.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/qwen35_ops.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

constexpr float kEps = 1e-6f;

std::mt19937 seeded_rng() {
  const unsigned seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937(seed);
}

// |got - want| <= rel * |want| + abs, element by element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= rel * std::fabs(want[i]) + abs) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
    }
  }
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

DeviceBuffer floats(int64_t n) { return DeviceBuffer(static_cast<size_t>(n) * sizeof(float)); }

std::vector<float> uniform_floats(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// ---- causal conv1d ------------------------------------------------------------------------------

struct ConvResult {
  std::vector<float> out, state;
};

ConvResult conv_gpu(int64_t C, int64_t K, const std::vector<float>& x, int64_t n,
                    const std::vector<float>& w, const std::vector<float>* state_in, bool silu) {
  const int64_t H = K - 1;
  const auto dx = test::to_device(x), dw = test::to_device(w);
  const DeviceBuffer dst = state_in ? test::to_device(*state_in) : DeviceBuffer();
  DeviceBuffer dso = floats(H * C), dout = floats(n * C);
  causal_conv1d({C, K}, dx.as<float>(), n, dw.as<float>(), state_in ? dst.as<float>() : nullptr,
                dso.as<float>(), dout.as<float>(), silu, nullptr);
  return {test::to_host<float>(dout, static_cast<size_t>(n * C)),
          test::to_host<float>(dso, static_cast<size_t>(H * C))};
}

ConvResult conv_cpu(int64_t C, int64_t K, const std::vector<float>& x, int64_t n,
                    const std::vector<float>& w, const std::vector<float>* state_in, bool silu,
                    cpu::ThreadPool& pool) {
  ConvResult r{std::vector<float>(static_cast<size_t>(n * C)),
               std::vector<float>(static_cast<size_t>((K - 1) * C))};
  model::causal_conv1d({C, K}, x.data(), n, w.data(), state_in ? state_in->data() : nullptr,
                       r.state.data(), r.out.data(), silu, pool);
  return r;
}

TEST(DeltaNetCuda, CausalConvMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  cpu::ThreadPool pool(4);
  struct Case {
    int64_t channels, kernel, n_tokens;
  };
  std::vector<Case> cases;
  for (const int64_t C : {200, 8192}) {
    for (const int64_t n : {1, 2, 3, 37}) cases.push_back({C, 4, n});
  }
  // Other tap counts, and an empty batch (the window is carried over unchanged).
  for (const Case c : {Case{67, 1, 3}, Case{67, 2, 5}, Case{67, 5, 2}, Case{67, 4, 0}}) {
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    const int64_t C = c.channels, K = c.kernel, n = c.n_tokens;
    const auto x = test::random_floats(n * C, rng);
    const auto w = test::random_floats(K * C, rng);
    const auto st = test::random_floats((K - 1) * C, rng);
    for (const bool silu : {false, true}) {
      for (const bool with_state : {true, false}) {
        const std::string what = "conv C " + std::to_string(C) + " K " + std::to_string(K) + " n " +
                                 std::to_string(n) + (silu ? " silu" : "") +
                                 (with_state ? " state" : " no state");
        const std::vector<float>* sin = with_state ? &st : nullptr;
        const ConvResult got = conv_gpu(C, K, x, n, w, sin, silu);
        const ConvResult want = conv_cpu(C, K, x, n, w, sin, silu, pool);
        // The sums are the CPU's operations in its order; only expf (silu) may differ by an ulp
        // or two from glibc's.
        expect_close(got.out, want.out, 1e-6, 1e-7, what + " out");
        EXPECT_EQ(got.state, want.state) << what << " state_out";
      }
    }
  }
}

TEST(DeltaNetCuda, CausalConvStateChainsAcrossBatches) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t C = 200, K = 4, H = K - 1;
  const auto x = test::random_floats(8 * C, rng);
  const auto w = test::random_floats(K * C, rng);
  const auto st = test::random_floats(H * C, rng);
  const auto dx = test::to_device(x), dw = test::to_device(w), dst = test::to_device(st);
  DeviceBuffer s_full = floats(H * C), s_mid = floats(H * C), s_end = floats(H * C);
  DeviceBuffer out_full = floats(8 * C), out_two = floats(8 * C);
  causal_conv1d({C, K}, dx.as<float>(), 8, dw.as<float>(), dst.as<float>(), s_full.as<float>(),
                out_full.as<float>(), true, nullptr);
  causal_conv1d({C, K}, dx.as<float>(), 5, dw.as<float>(), dst.as<float>(), s_mid.as<float>(),
                out_two.as<float>(), true, nullptr);
  causal_conv1d({C, K}, dx.as<float>() + 5 * C, 3, dw.as<float>(), s_mid.as<float>(),
                s_end.as<float>(), out_two.as<float>() + 5 * C, true, nullptr);
  EXPECT_EQ(test::to_host<float>(out_two, 8 * C), test::to_host<float>(out_full, 8 * C));
  EXPECT_EQ(test::to_host<float>(s_end, H * C), test::to_host<float>(s_full, H * C));
}

// ---- L2 norm of heads ---------------------------------------------------------------------------

TEST(DeltaNetCuda, L2NormHeadsMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  struct Case {
    int64_t n_tokens, n_heads, head_dim, row_stride;
  };
  // The model's q|k heads at the start of a conv row, odd sizes, heads longer than a warp's
  // stride, and rows with an untouched tail.
  for (const Case c : {Case{1, 32, 128, 8192}, Case{7, 4, 48, 200}, Case{5, 3, 40, 121},
                       Case{3, 2, 300, 640}, Case{4, 6, 16, 96}, Case{2, 1, 1, 1}}) {
    auto x = test::random_floats(c.n_tokens * c.row_stride, rng);
    for (auto& v : x) v *= 3.0f;
    for (int64_t i = 0; i < c.head_dim; ++i) x[static_cast<size_t>(i)] = 0.0f;  // eps path
    const auto dx = test::to_device(x);
    l2norm_heads(dx.as<float>(), c.n_tokens, c.row_stride, c.n_heads, c.head_dim, kEps, nullptr);
    std::vector<float> want = x;
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      model::l2norm_rows(want.data() + t * c.row_stride, c.n_heads, c.head_dim, kEps);
    }
    const auto got = test::to_host<float>(dx, x.size());
    const std::string what = "l2norm " + std::to_string(c.n_heads) + " x " +
                             std::to_string(c.head_dim) + " stride " + std::to_string(c.row_stride);
    expect_close(got, want, 1e-6, 0, what);
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      for (int64_t col = c.n_heads * c.head_dim; col < c.row_stride; ++col) {
        const size_t i = static_cast<size_t>(t * c.row_stride + col);
        ASSERT_EQ(got[i], x[i]) << what << ": column " << col << " must be untouched";
      }
    }
  }
}

// ---- gated DeltaNet -----------------------------------------------------------------------------

struct DnCase {
  int64_t nk, nv, dk, dv, pad;  // pad: extra columns of the shared row beyond q | k | v
  int64_t stride() const { return 2 * nk * dk + nv * dv + pad; }
  std::string name() const {
    return "NK " + std::to_string(nk) + " NV " + std::to_string(nv) + " DK " + std::to_string(dk) +
           " DV " + std::to_string(dv);
  }
};

// The model's layout: q, k, v of a token side by side in one conv row of `stride` floats, q and
// k heads L2-normalised.
struct DnInputs {
  std::vector<float> rows, g, beta, state;
};

DnInputs dn_inputs(const DnCase& c, int64_t n, std::mt19937& rng) {
  DnInputs in;
  in.rows = test::random_floats(n * c.stride(), rng);
  for (int64_t t = 0; t < n; ++t) {
    model::l2norm_rows(in.rows.data() + t * c.stride(), 2 * c.nk, c.dk, kEps);
  }
  in.g = uniform_floats(n * c.nv, -3.0f, 0.0f, rng);
  in.beta = uniform_floats(n * c.nv, 0.001f, 1.0f, rng);
  in.state = test::random_floats(c.nv * c.dv * c.dk, rng);
  return in;
}

struct DnResult {
  std::vector<float> out, state;
};

DnResult dn_cpu(const DnCase& c, const DnInputs& in, int64_t n, bool with_state,
                cpu::ThreadPool& pool) {
  DnResult r{std::vector<float>(static_cast<size_t>(n * c.nv * c.dv)),
             std::vector<float>(in.state.size())};
  const float* q = in.rows.data();
  model::gated_delta_net({c.nk, c.nv, c.dk, c.dv}, q, q + c.nk * c.dk, q + 2 * c.nk * c.dk,
                         c.stride(), in.g.data(), in.beta.data(), n,
                         with_state ? in.state.data() : nullptr, r.state.data(), r.out.data(),
                         pool);
  return r;
}

// The size of the terms each output sums: sum_i |s_i q_i| / sqrt(head_k), with the state s
// carried in double. An output whose terms cancel (a query nearly orthogonal to the state) is
// tiny, and both float implementations' rounding, relative to it, is not; relative to this it is
// the few ulps the summation orders differ by.
std::vector<double> dn_out_scale(const DnCase& c, const DnInputs& in, int64_t n, bool with_state) {
  const int64_t C = c.stride();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
  std::vector<double> mag(static_cast<size_t>(n * c.nv * c.dv));
  std::vector<double> st(static_cast<size_t>(c.dk));
  for (int64_t h = 0; h < c.nv; ++h) {
    const int64_t kh = h % c.nk;
    for (int64_t r = 0; r < c.dv; ++r) {
      const float* s0 = in.state.data() + (h * c.dv + r) * c.dk;
      for (int64_t i = 0; i < c.dk; ++i) st[static_cast<size_t>(i)] = with_state ? s0[i] : 0.0;
      for (int64_t t = 0; t < n; ++t) {
        const float* q = in.rows.data() + t * C + kh * c.dk;
        const float* k = q + c.nk * c.dk;
        const double v = in.rows[static_cast<size_t>(t * C + 2 * c.nk * c.dk + h * c.dv + r)];
        const double decay = std::exp(static_cast<double>(in.g[static_cast<size_t>(t * c.nv + h)]));
        const double beta = in.beta[static_cast<size_t>(t * c.nv + h)];
        double u = 0;
        for (int64_t i = 0; i < c.dk; ++i) {
          st[static_cast<size_t>(i)] *= decay;
          u += st[static_cast<size_t>(i)] * k[i];
        }
        const double d = (v - u) * beta;
        double m = 0;
        for (int64_t i = 0; i < c.dk; ++i) {
          st[static_cast<size_t>(i)] += d * k[i];
          m += std::fabs(st[static_cast<size_t>(i)] * q[i]);
        }
        mag[static_cast<size_t>((t * c.nv + h) * c.dv + r)] = m * scale;
      }
    }
  }
  return mag;
}

// ||got - want|| / ||scale||.
double error_vs_scale(const std::vector<float>& got, const std::vector<float>& want,
                      const std::vector<double>& scale) {
  double e = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    e += d * d;
    n += scale[i] * scale[i];
  }
  return std::sqrt(e / n);
}

// Runs the batch on the GPU as `splits` consecutive calls chained through the state.
DnResult dn_gpu(const DnCase& c, const DnInputs& in, int64_t n, bool with_state,
                const std::vector<int64_t>& splits) {
  const auto drows = test::to_device(in.rows), dg = test::to_device(in.g),
             dbeta = test::to_device(in.beta), dstate = test::to_device(in.state);
  const int64_t state_n = c.nv * c.dv * c.dk, width = c.nv * c.dv, C = c.stride();
  DeviceBuffer dout = floats(n * width), s_a = floats(state_n), s_b = floats(state_n);
  const float* state_in = with_state ? dstate.as<float>() : nullptr;
  float* state_out = s_a.as<float>();
  int64_t t0 = 0;
  for (const int64_t m : splits) {
    const float* q = drows.as<float>() + t0 * C;
    gated_delta_net({c.nk, c.nv, c.dk, c.dv}, q, q + c.nk * c.dk, q + 2 * c.nk * c.dk, C,
                    dg.as<float>() + t0 * c.nv, dbeta.as<float>() + t0 * c.nv, m, state_in,
                    state_out, dout.as<float>() + t0 * width, nullptr);
    state_in = state_out;
    state_out = state_out == s_a.as<float>() ? s_b.as<float>() : s_a.as<float>();
    t0 += m;
  }
  EXPECT_EQ(t0, n);
  const DeviceBuffer& last = state_in == s_a.as<float>() ? s_a : s_b;
  return {test::to_host<float>(dout, static_cast<size_t>(n * width)),
          test::to_host<float>(last, static_cast<size_t>(state_n))};
}

const std::vector<DnCase>& dn_cases() {
  static const std::vector<DnCase> cases = {
      {2, 4, 48, 40, 3},      // not powers of two, a partial row block per head
      {16, 32, 128, 128, 0},  // Qwen3.6-35B-A3B
      {1, 2, 16, 16, 0},      // tiny test models
      {3, 6, 20, 33, 5},      // head_k below a warp, several key heads
      {1, 1, 256, 24, 1},     // the largest head_k
  };
  return cases;
}

TEST(DeltaNetCuda, GatedDeltaNetMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  cpu::ThreadPool pool(4);
  for (const DnCase& c : dn_cases()) {
    // 37 tokens cross the kernel's staging passes of 16.
    for (const int64_t n : {1, 7, 37}) {
      const DnInputs in = dn_inputs(c, n, rng);
      for (const bool with_state : {true, false}) {
        const std::string what =
            c.name() + " n " + std::to_string(n) + (with_state ? " state" : " no state");
        const DnResult got = dn_gpu(c, in, n, with_state, {n});
        const DnResult want = dn_cpu(c, in, n, with_state, pool);
        // The dot products are summed in another order than the CPU's eight-lane sums.
        EXPECT_LE(error_vs_scale(got.out, want.out, dn_out_scale(c, in, n, with_state)), 1e-5)
            << what << " out";
        EXPECT_LE(test::normalized_error(got.state, to_double(want.state)), 1e-5)
            << what << " state_out";
      }
    }
  }
}

TEST(DeltaNetCuda, GatedDeltaNetStateChainsAcrossBatches) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  cpu::ThreadPool pool(4);
  for (const DnCase& c : {dn_cases()[0], dn_cases()[1]}) {
    for (const auto& splits : {std::vector<int64_t>{4, 3}, std::vector<int64_t>{20, 1, 16}}) {
      int64_t n = 0;
      for (const int64_t m : splits) n += m;
      const DnInputs in = dn_inputs(c, n, rng);
      const std::string what = c.name() + " in " + std::to_string(splits.size()) + " batches";
      const DnResult one = dn_gpu(c, in, n, true, {n});
      const DnResult chained = dn_gpu(c, in, n, true, splits);
      // Every token's arithmetic is the same whatever the batch: bit-identical results.
      EXPECT_EQ(chained.out, one.out) << what;
      EXPECT_EQ(chained.state, one.state) << what;
      const DnResult want = dn_cpu(c, in, n, true, pool);
      EXPECT_LE(error_vs_scale(chained.out, want.out, dn_out_scale(c, in, n, true)), 1e-5) << what;
      EXPECT_LE(test::normalized_error(chained.state, to_double(want.state)), 1e-5) << what;
    }
  }
}

TEST(DeltaNetCuda, RejectsBadArguments) {
  // Distinct fake device pointers, far enough apart not to overlap; nothing is launched.
  const auto p = [](int i) { return reinterpret_cast<float*>(uintptr_t{1} << (24 + i)); };
  float *x = p(0), *w = p(1), *si = p(2), *so = p(3), *out = p(4);
  const auto conv = [](CausalConvDims d, int64_t n, const float* xx, const float* ww,
                       const float* sin, float* sout, float* o) {
    causal_conv1d(d, xx, n, ww, sin, sout, o, /*silu=*/true, /*stream=*/nullptr);
  };
  test::expect_error([&] { conv({0, 4}, 2, x, w, si, so, out); }, "causal_conv1d: invalid shape");
  test::expect_error([&] { conv({8, 0}, 2, x, w, si, so, out); }, "causal_conv1d: invalid shape");
  test::expect_error([&] { conv({8, 4}, -1, x, w, si, so, out); }, "causal_conv1d: invalid shape");
  test::expect_error([&] { conv({8, 4}, 2, x, nullptr, si, so, out); }, "causal_conv1d: null");
  test::expect_error([&] { conv({8, 4}, 2, x, w, si, nullptr, out); }, "causal_conv1d: null");
  test::expect_error([&] { conv({8, 4}, 2, nullptr, w, si, so, out); }, "causal_conv1d: null");
  test::expect_error([&] { conv({8, 4}, 2, x, w, si, so, x + 4); }, "out overlaps x");
  test::expect_error([&] { conv({8, 4}, 2, x, w, si, si, out); }, "state_out overlaps state_in");
  test::expect_error([&] { conv({8, 4}, 2, x, w, si, x + 15, out); }, "state_out overlaps x");
  conv({8, 1}, 0, nullptr, w, nullptr, nullptr, nullptr);  // nothing to do: no launch

  test::expect_error([&] { l2norm_heads(x, 2, 64, 0, 16, kEps, nullptr); },
                     "l2norm_heads: invalid shape");
  test::expect_error([&] { l2norm_heads(x, 2, 64, 4, 0, kEps, nullptr); },
                     "l2norm_heads: invalid shape");
  test::expect_error([&] { l2norm_heads(x, 2, 63, 4, 16, kEps, nullptr); },
                     "l2norm_heads: row_stride");
  test::expect_error([&] { l2norm_heads(nullptr, 2, 64, 4, 16, kEps, nullptr); },
                     "l2norm_heads: null");
  l2norm_heads(nullptr, 0, 64, 4, 16, kEps, nullptr);

  float *q = p(5), *g = p(6), *beta = p(7);
  const DeltaNetDims ok{2, 4, 16, 8};
  const int64_t C = 2 * 2 * 16 + 4 * 8;
  // k and v follow q in the row, as in the model (none when q is null).
  const auto dn = [&](DeltaNetDims d, int64_t stride, const float* qq, const float* sin,
                      float* sout, float* o) {
    gated_delta_net(d, qq, qq ? qq + 32 : nullptr, qq ? qq + 64 : nullptr, stride, g, beta, 3, sin,
                    sout, o, nullptr);
  };
  const DeltaNetDims no_k_heads{0, 4, 16, 8}, no_head_v{2, 4, 16, 0}, ragged{4, 6, 16, 8},
      wide{2, 4, 257, 8};
  test::expect_error([&] { dn(no_k_heads, C, q, si, so, out); }, "gated_delta_net: invalid shape");
  test::expect_error([&] { dn(no_head_v, C, q, si, so, out); }, "gated_delta_net: invalid shape");
  test::expect_error([&] { dn(ragged, C, q, si, so, out); }, "not a multiple");
  test::expect_error([&] { dn(wide, 4096, q, si, so, out); }, "head_k 257");
  test::expect_error([&] { dn(ok, 31, q, si, so, out); }, "gated_delta_net: stride");
  test::expect_error([&] { dn(ok, C, nullptr, si, so, out); }, "gated_delta_net: null");
  test::expect_error([&] { dn(ok, C, q, si, nullptr, out); }, "gated_delta_net: null");
  test::expect_error([&] { dn(ok, C, q, si, so, nullptr); }, "gated_delta_net: null");
  test::expect_error([&] { dn(ok, C, q, si, si + 100, out); }, "state_out overlaps state_in");
  // v's rows reach q + 64 + 2 * C + 32 = q + 288, q's and k's end before q + 260.
  test::expect_error([&] { dn(ok, C, q, si, so, q + 260); }, "out overlaps v");
  test::expect_error([&] { dn(ok, C, q, si, so, so + 1); }, "state_out overlaps out");
  gated_delta_net(ok, nullptr, nullptr, nullptr, C, nullptr, nullptr, 0, nullptr, nullptr, nullptr,
                  nullptr);
}

// ---- qwen35moe element-wise ops -----------------------------------------------------------------

TEST(Qwen35OpsCuda, DeltaNetGatesMatchScalarLoop) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n_tokens, n_heads] : {std::pair<int64_t, int64_t>{37, 32}, {1, 32}, {5, 3}}) {
    const int64_t n = n_tokens * n_heads;
    auto beta = test::random_floats(n, rng), g = test::random_floats(n, rng);
    for (auto& v : beta) v *= 4.0f;
    for (auto& v : g) v *= 8.0f;
    g[0] = 30.0f;  // softplus passes values above 20 through
    const auto dt_bias = test::random_floats(n_heads, rng);
    auto ssm_a = uniform_floats(n_heads, -1.0f, 1.0f, rng);
    for (auto& v : ssm_a) v = -std::exp(v);
    const auto dbeta = test::to_device(beta), dg = test::to_device(g),
               dbias = test::to_device(dt_bias), da = test::to_device(ssm_a);
    delta_net_gates(dbeta.as<float>(), dg.as<float>(), dbias.as<float>(), da.as<float>(), n_tokens,
                    n_heads, nullptr);
    std::vector<float> want_beta(beta.size()), want_g(g.size());
    for (int64_t i = 0; i < n; ++i) {
      const auto ii = static_cast<size_t>(i), h = static_cast<size_t>(i % n_heads);
      want_beta[ii] = model::sigmoid(beta[ii]);
      want_g[ii] = ssm_a[h] * model::softplus(g[ii] + dt_bias[h]);
    }
    expect_close(test::to_host<float>(dbeta, beta.size()), want_beta, 1e-6, 0, "beta");
    // For very negative inputs an ulp of exp can round 1 + exp(v) differently (an absolute
    // error of ~1e-7 * |ssm_a| in the log), hence the absolute term.
    expect_close(test::to_host<float>(dg, g.size()), want_g, 2e-6, 1e-6, "g");
  }
}

TEST(Qwen35OpsCuda, RmsNormGatedMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n_rows, n] :
       {std::pair<int64_t, int64_t>{37 * 4, 40}, {64, 128}, {3, 2048}, {5, 67}}) {
    auto x = test::random_floats(n_rows * n, rng);
    auto z = test::random_floats(n_rows * n, rng);
    for (auto& v : x) v *= 3.0f;
    for (auto& v : z) v *= 3.0f;
    const auto w = test::random_floats(n, rng);
    const auto dx = test::to_device(x), dw = test::to_device(w), dz = test::to_device(z);
    DeviceBuffer dy = floats(n_rows * n);
    rmsnorm_gated(dx.as<float>(), dw.as<float>(), dz.as<float>(), dy.as<float>(), n_rows, n, kEps,
                  nullptr);
    std::vector<float> want(x.size());
    model::rmsnorm_gated_rows(x.data(), w.data(), z.data(), want.data(), n_rows, n, kEps);
    const std::string what = "rmsnorm_gated " + std::to_string(n_rows) + " x " + std::to_string(n);
    expect_close(test::to_host<float>(dy, x.size()), want, 1e-6, 0, what);
    rmsnorm_gated(dx.as<float>(), dw.as<float>(), dz.as<float>(), dx.as<float>(), n_rows, n, kEps,
                  nullptr);
    expect_close(test::to_host<float>(dx, x.size()), want, 1e-6, 0, what + " in place");
  }
}

TEST(Qwen35OpsCuda, SplitQueryGate) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n_tokens = 5, n_head = 3, hd = 40, width = n_head * hd;
  const auto qg = test::random_floats(n_tokens * 2 * width, rng);
  const auto dqg = test::to_device(qg);
  DeviceBuffer dq = floats(n_tokens * width), dgate = floats(n_tokens * width);
  split_query_gate(dqg.as<float>(), dq.as<float>(), dgate.as<float>(), n_tokens, n_head, hd,
                   nullptr);
  std::vector<float> want_q(static_cast<size_t>(n_tokens * width)), want_gate(want_q.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_head; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        const auto o = static_cast<size_t>(t * width + h * hd + d);
        const auto src = static_cast<size_t>(t * 2 * width + h * 2 * hd + d);
        want_q[o] = qg[src];
        want_gate[o] = qg[src + static_cast<size_t>(hd)];
      }
    }
  }
  EXPECT_EQ(test::to_host<float>(dq, want_q.size()), want_q);
  EXPECT_EQ(test::to_host<float>(dgate, want_gate.size()), want_gate);
}

TEST(Qwen35OpsCuda, MulSigmoid) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n = 100003;
  const auto x = test::random_floats(n, rng);
  auto gate = test::random_floats(n, rng);
  for (auto& v : gate) v *= 4.0f;
  const auto dx = test::to_device(x), dgate = test::to_device(gate);
  mul_sigmoid(dx.as<float>(), dgate.as<float>(), n, nullptr);
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * model::sigmoid(gate[i]);
  expect_close(test::to_host<float>(dx, x.size()), want, 1e-6, 0, "mul_sigmoid");
}

TEST(Qwen35OpsCuda, SharedExpertCombineInLlamaOrder) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n_tokens = 9, E = 259, n = n_tokens * E;
  const auto routed = test::random_floats(n, rng), shared = test::random_floats(n, rng),
             h = test::random_floats(n, rng);
  auto s = test::random_floats(n_tokens, rng);
  for (auto& v : s) v *= 3.0f;
  std::vector<float> want(static_cast<size_t>(n));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float sg = model::sigmoid(s[static_cast<size_t>(t)]);
    for (int64_t d = 0; d < E; ++d) {
      const auto i = static_cast<size_t>(t * E + d);
      want[i] = (routed[i] + shared[i] * sg) + h[i];
    }
  }
  const auto dshared = test::to_device(shared), ds = test::to_device(s);
  // An ulp of exp in sigmoid(s), scaled by |shared|, survives cancellation in the sums: hence
  // the absolute term.
  for (const int alias : {0, 1, 2}) {  // x separate, x = routed, x = h
    const auto drouted = test::to_device(routed), dh = test::to_device(h);
    DeviceBuffer dx = floats(n);
    float* x = alias == 1 ? drouted.as<float>() : alias == 2 ? dh.as<float>() : dx.as<float>();
    shared_expert_combine(drouted.as<float>(), dshared.as<float>(), ds.as<float>(), dh.as<float>(),
                          x, n_tokens, E, nullptr);
    const DeviceBuffer& res = alias == 1 ? drouted : alias == 2 ? dh : dx;
    expect_close(test::to_host<float>(res, want.size()), want, 1e-6, 2e-6,
                 "shared_expert_combine alias " + std::to_string(alias));
  }
}

TEST(Qwen35OpsCuda, RejectsBadArguments) {
  const auto p = [](int i) { return reinterpret_cast<float*>(uintptr_t{1} << (24 + i)); };
  float *a = p(0), *b = p(1), *c = p(2), *d = p(3), *e = p(4);
  test::expect_error([&] { delta_net_gates(a, b, c, d, 2, 0, nullptr); },
                     "delta_net_gates: invalid shape");
  test::expect_error([&] { delta_net_gates(a, b, c, d, -1, 4, nullptr); },
                     "delta_net_gates: invalid shape");
  test::expect_error([&] { delta_net_gates(a, b, nullptr, d, 2, 4, nullptr); },
                     "delta_net_gates: null");
  test::expect_error([&] { rmsnorm_gated(a, b, c, d, 2, 0, kEps, nullptr); },
                     "rmsnorm_gated: invalid shape");
  test::expect_error([&] { rmsnorm_gated(a, b, nullptr, d, 2, 8, kEps, nullptr); },
                     "rmsnorm_gated: null");
  test::expect_error([&] { split_query_gate(a, b, c, 2, 4, 0, nullptr); },
                     "split_query_gate: invalid shape");
  test::expect_error([&] { split_query_gate(a, b, c, 2, 0, 8, nullptr); },
                     "split_query_gate: invalid shape");
  test::expect_error([&] { split_query_gate(a, nullptr, c, 2, 4, 8, nullptr); },
                     "split_query_gate: null");
  test::expect_error([&] { mul_sigmoid(a, b, -1, nullptr); }, "mul_sigmoid: negative");
  test::expect_error([&] { mul_sigmoid(a, nullptr, 4, nullptr); }, "mul_sigmoid: null");
  test::expect_error([&] { shared_expert_combine(a, b, c, d, e, 2, 0, nullptr); },
                     "shared_expert_combine: invalid shape");
  test::expect_error([&] { shared_expert_combine(a, b, nullptr, d, e, 2, 8, nullptr); },
                     "shared_expert_combine: null");
  // Zero elements: nothing to do, nothing launched.
  delta_net_gates(nullptr, nullptr, nullptr, nullptr, 0, 4, nullptr);
  rmsnorm_gated(nullptr, nullptr, nullptr, nullptr, 0, 8, kEps, nullptr);
  split_query_gate(nullptr, nullptr, nullptr, 0, 4, 8, nullptr);
  mul_sigmoid(nullptr, nullptr, 0, nullptr);
  shared_expert_combine(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr);
}

}  // namespace
}  // namespace moe::cuda
