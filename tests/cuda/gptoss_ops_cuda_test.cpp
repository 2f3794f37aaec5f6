// gpt-oss's layer kernels against the CPU implementations on fresh random data: the router's
// SOFTMAX_WEIGHT gating and bias (router_topk, router_decode), SwiGLU-OAI with the experts' biases,
// and the projection and expert biases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cpu/router.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/router.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

std::mt19937 seeded_rng() {
  const unsigned seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937(seed);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= rel * std::fabs(want[i]) + abs) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
    }
  }
}

// Distinct logits of both signs, 0.01 apart (no near-ties an ulp could flip), shuffled per token.
std::vector<float> distinct_logits(int64_t n_tokens, int64_t n_expert, std::mt19937& rng) {
  std::vector<float> logits(static_cast<size_t>(n_tokens * n_expert));
  std::vector<int> perm(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const float offset = std::uniform_real_distribution<float>(-4.0f, 1.0f)(rng);
    for (int64_t e = 0; e < n_expert; ++e) {
      logits[static_cast<size_t>(t * n_expert + e)] =
          0.01f * static_cast<float>(perm[static_cast<size_t>(e)]) + offset;
    }
  }
  return logits;
}

TEST(GptOssOpsCuda, RouterTopKSoftmaxWeightMatchesCpuIncludingTies) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n_expert, k] :
       {std::pair<int64_t, int64_t>{32, 4}, {128, 4}, {60, 8}, {1024, 32}, {4, 4}}) {
    const int64_t n_tokens = 7;
    auto logits = distinct_logits(n_tokens, n_expert, rng);
    // Token 1: all equal (negative); token 2: ties inside and across the top k, of both signs.
    std::fill(logits.begin() + n_expert, logits.begin() + 2 * n_expert, -0.75f);
    float* t2 = logits.data() + 2 * n_expert;
    for (int64_t e = 0; e < n_expert; e += 3) t2[e] = -2.0f;
    for (int64_t e = 1; e < n_expert; e += 5) t2[e] = 3.0f;
    const auto dl = test::to_device(logits);
    const auto nk = static_cast<size_t>(n_tokens * k);
    DeviceBuffer dp(logits.size() * 4), di(nk * 4), dwt(nk * 4);
    router_topk(dl.as<float>(), n_tokens, n_expert, k, dp.as<float>(), di.as<int32_t>(),
                dwt.as<float>(), nullptr, /*softmax_weight=*/true);
    const auto probs = test::to_host<float>(dp, logits.size());
    const auto ids = test::to_host<int32_t>(di, nk);
    const auto weights = test::to_host<float>(dwt, nk);
    std::vector<float> want_p(static_cast<size_t>(n_expert)), want_w(static_cast<size_t>(k));
    std::vector<int32_t> want_i(static_cast<size_t>(k));
    for (int64_t t = 0; t < n_tokens; ++t) {
      model::route_token_softmax_weight(logits.data() + t * n_expert, n_expert, k, nullptr,
                                        want_p.data(), want_i.data(), want_w.data());
      const std::string what = std::to_string(n_expert) + " experts, token " + std::to_string(t);
      expect_close(
          std::vector<float>(probs.begin() + t * n_expert, probs.begin() + (t + 1) * n_expert),
          want_p, 1e-6, 1e-12, what + " probs");
      EXPECT_EQ(std::vector<int32_t>(ids.begin() + t * k, ids.begin() + (t + 1) * k), want_i)
          << what;
      expect_close(std::vector<float>(weights.begin() + t * k, weights.begin() + (t + 1) * k),
                   want_w, 2e-6, 1e-12, what + " weights");
    }
  }
}

// The fused decode router with gpt-oss's bias and gating: logits equal matmul() + add_bias() bit
// for bit, the choice and weights equal the CPU's SOFTMAX_WEIGHT routing of those logits.
TEST(GptOssOpsCuda, RouterDecodeWithBiasMatchesMatmulAndCpuRouter) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  struct Case {
    GgmlType type;
    int64_t n_in, n_expert, k;
  };
  for (const Case& c : {Case{GgmlType::BF16, 2880, 32, 4}, Case{GgmlType::BF16, 2880, 128, 4},
                        Case{GgmlType::F16, 512, 60, 8}, Case{GgmlType::F32, 256, 8, 8}}) {
    const std::string what = std::string(ggml_type_info_or_throw(c.type).name) + " " +
                             std::to_string(c.n_expert) + "x" + std::to_string(c.n_in);
    std::vector<uint8_t> wbytes;
    for (int64_t e = 0; e < c.n_expert; ++e) {
      const auto row = test::random_row(c.type, c.n_in, rng);
      wbytes.insert(wbytes.end(), row.begin(), row.end());
    }
    const auto dw = test::to_device(wbytes);
    const DeviceMatrix w = make_device_matrix(c.type, dw.get(), c.n_in, c.n_expert);
    auto bias = test::random_floats(c.n_expert, rng);
    for (auto& b : bias) b *= 3.0f;  // large enough to change the choice
    const auto dbias = test::to_device(bias);
    std::vector<uintptr_t> table(static_cast<size_t>(3 * c.n_expert));
    for (size_t i = 0; i < table.size(); ++i) table[i] = 0x100000 + 64 * i;
    const auto dtable = test::to_device(table);
    const auto n = static_cast<size_t>(c.n_expert), k = static_cast<size_t>(c.k);
    DeviceBuffer dlog(n * 4), dref(n * 4), dp(n * 4), di(k * 4), dwt(k * 4), dptr(3 * k * 8),
        dcount(4);
    ASSERT_EQ(cudaMemset(dcount.get(), 0, 4), cudaSuccess);
    const auto** gate = static_cast<const void**>(dptr.get());
    RouterDecodeOut out{dlog.as<float>(),
                        dp.as<float>(),
                        di.as<int32_t>(),
                        dwt.as<float>(),
                        static_cast<const void* const*>(dtable.get()),
                        gate,
                        gate + k,
                        gate + 2 * k,
                        static_cast<unsigned*>(dcount.get())};
    out.bias = dbias.as<float>();
    out.softmax_weight = true;
    for (int rep = 0; rep < 3; ++rep) {
      const auto dx = test::to_device(test::random_floats(c.n_in, rng));
      router_decode(w, dx.as<float>(), c.k, out, nullptr);
      matmul(w, dx.as<float>(), 1, dref.as<float>(), nullptr);
      add_bias(dref.as<float>(), 1, c.n_expert, c.n_expert, dbias.as<float>(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto logits = test::to_host<float>(dlog, n);
      EXPECT_EQ(logits, test::to_host<float>(dref, n)) << what << ": logits differ";
      std::vector<float> want_p(n), want_w(k);
      std::vector<int32_t> want_i(k);
      model::route_token_softmax_weight(logits.data(), c.n_expert, c.k, nullptr, want_p.data(),
                                        want_i.data(), want_w.data());
      EXPECT_EQ(test::to_host<int32_t>(di, k), want_i) << what;
      expect_close(test::to_host<float>(dp, n), want_p, 1e-6, 1e-12, what + " probs");
      expect_close(test::to_host<float>(dwt, k), want_w, 2e-6, 1e-12, what + " weights");
      const auto ptrs = test::to_host<uintptr_t>(dptr, 3 * k);
      for (size_t j = 0; j < k; ++j) {
        EXPECT_EQ(ptrs[j], table[3 * static_cast<size_t>(want_i[j])]) << what << " gate " << j;
      }
      EXPECT_EQ(test::to_host<unsigned>(dcount, 1)[0], 0u) << what << ": counter not reset";
    }
  }
}

TEST(GptOssOpsCuda, SwigluOaiWithExpertBiasesMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n_rows = 37, n_ff = 2880, n_expert = 32;
  auto scaled = [&](int64_t n, float s) {
    auto v = test::random_floats(n, rng);
    for (auto& x : v) x *= s;  // beyond the clamp at 7 for many values
    return v;
  };
  const auto g = scaled(n_rows * n_ff, 10.0f), u = scaled(n_rows * n_ff, 10.0f);
  const auto gb = scaled(n_expert * n_ff, 2.0f), ub = scaled(n_expert * n_ff, 2.0f);
  std::vector<int32_t> ex(static_cast<size_t>(n_rows));
  for (auto& e : ex) e = std::uniform_int_distribution<int32_t>(0, n_expert - 1)(rng);
  ex[5] = static_cast<int32_t>(n_expert);  // out of range: a NaN row, no read outside the biases
  const auto dg = test::to_device(g), du = test::to_device(u), dgb = test::to_device(gb),
             dub = test::to_device(ub), dex = test::to_device(ex);
  DeviceBuffer dh(g.size() * 4);
  swiglu_oai(dg.as<float>(), du.as<float>(), dh.as<float>(), n_rows, n_ff, dex.as<int32_t>(),
             dgb.as<float>(), dub.as<float>(), n_expert, 1.702f, 7.0f, nullptr);
  const auto h = test::to_host<float>(dh, g.size());
  std::vector<float> want, got;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t c = 0; c < n_ff; ++c) {
      const auto i = static_cast<size_t>(r * n_ff + c);
      if (r == 5) {
        EXPECT_TRUE(std::isnan(h[i])) << "column " << c;
        continue;
      }
      const auto b = static_cast<size_t>(ex[static_cast<size_t>(r)] * n_ff + c);
      want.push_back(model::swiglu_oai(g[i] + gb[b], u[i] + ub[b]));
      got.push_back(h[i]);
    }
  }
  expect_close(got, want, 4e-6, 1e-30, "swiglu_oai with biases");

  // No biases, in place over g.
  swiglu_oai(dg.as<float>(), du.as<float>(), dg.as<float>(), n_rows, n_ff, nullptr, nullptr,
             nullptr, 0, 1.702f, 7.0f, nullptr);
  want.clear();
  for (size_t i = 0; i < g.size(); ++i) want.push_back(model::swiglu_oai(g[i], u[i]));
  expect_close(test::to_host<float>(dg, g.size()), want, 4e-6, 1e-30, "swiglu_oai");
}

TEST(GptOssOpsCuda, BiasesAddExactly) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  // A projection's bias on rows of a wider stacked output (q, k, v side by side).
  const int64_t n_rows = 9, width = 4096, stride = 5120, n_expert = 32, E = 2880;
  const auto y = test::random_floats(n_rows * stride, rng);
  const auto bias = test::random_floats(width, rng);
  const auto dy = test::to_device(y), db = test::to_device(bias);
  add_bias(dy.as<float>(), n_rows, width, stride, db.as<float>(), nullptr);
  auto want = y;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      want[static_cast<size_t>(r * stride + c)] += bias[static_cast<size_t>(c)];
    }
  }
  EXPECT_EQ(test::to_host<float>(dy, y.size()), want);

  const auto out = test::random_floats(n_rows * E, rng);
  const auto eb = test::random_floats(n_expert * E, rng);
  std::vector<int32_t> ex(static_cast<size_t>(n_rows));
  for (auto& e : ex) e = std::uniform_int_distribution<int32_t>(0, n_expert - 1)(rng);
  ex[3] = -1;
  const auto dout = test::to_device(out), deb = test::to_device(eb), dex = test::to_device(ex);
  add_expert_bias(dout.as<float>(), n_rows, E, dex.as<int32_t>(), deb.as<float>(), n_expert,
                  nullptr);
  const auto got = test::to_host<float>(dout, out.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t c = 0; c < E; ++c) {
      const auto i = static_cast<size_t>(r * E + c);
      if (r == 3) {
        EXPECT_TRUE(std::isnan(got[i]));
      } else {
        EXPECT_EQ(got[i], out[i] + eb[static_cast<size_t>(ex[static_cast<size_t>(r)] * E + c)])
            << r << "," << c;
      }
    }
  }
}

// Host-side argument checks (no GPU needed: they throw before any CUDA call).
TEST(GptOssOpsCuda, RejectsBadArguments) {
  auto* f = reinterpret_cast<float*>(uintptr_t{0x10000});
  auto* i32 = reinterpret_cast<int32_t*>(uintptr_t{0x20000});
  test::expect_error([&] { swiglu_oai(f, f, f, -1, 8, i32, f, f, 4, 1.7f, 7, nullptr); },
                     "negative");
  test::expect_error([&] { swiglu_oai(f, nullptr, f, 2, 8, i32, f, f, 4, 1.7f, 7, nullptr); },
                     "null");
  test::expect_error([&] { swiglu_oai(f, f, f, 2, 8, nullptr, f, f, 4, 1.7f, 7, nullptr); },
                     "experts");
  test::expect_error([&] { add_bias(f, 2, 8, 4, f, nullptr); }, "stride");
  test::expect_error([&] { add_bias(f, 2, 8, 8, nullptr, nullptr); }, "null");
  test::expect_error([&] { add_expert_bias(f, 2, 8, nullptr, f, 4, nullptr); }, "null");
  test::expect_error([&] { add_expert_bias(f, 2, 8, i32, f, 0, nullptr); }, "experts");
  test::expect_error([&] { router_topk(f, 1, 128, 33, f, i32, f, nullptr, true); }, "k 33");
}

}  // namespace
}  // namespace moe::cuda
