// The small layer kernels against the CPU implementations: SwiGLU, add, MoE combine, embedding
// rows, RMSNorm, RoPE, router.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/router.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

std::mt19937 seeded_rng() {
  const unsigned seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937(seed);
}

// |got - want| <= rel * |want| + abs, element by element.
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

TEST(OpsCuda, SwigluAndAdd) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n = 100003;
  auto g = test::random_floats(n, rng);
  for (auto& v : g) v *= 4.0f;
  const auto u = test::random_floats(n, rng);
  const auto dg = test::to_device(g), du = test::to_device(u);
  cuda::DeviceBuffer dh(n * sizeof(float));
  swiglu(dg.as<float>(), du.as<float>(), dh.as<float>(), n, nullptr);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  expect_close(test::to_host<float>(dh, n), want, 2e-6, 1e-30, "swiglu");

  // In place over g (h aliases g), as the forward may do.
  swiglu(dg.as<float>(), du.as<float>(), dg.as<float>(), n, nullptr);
  expect_close(test::to_host<float>(dg, n), want, 2e-6, 1e-30, "swiglu in place");

  const auto dx = test::to_device(g);
  add_inplace(dx.as<float>(), du.as<float>(), n, nullptr);
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = g[i] + u[i];
  EXPECT_EQ(test::to_host<float>(dx, n), sum);
}

TEST(OpsCuda, CombineRowsInTheScalarLoopOrder) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n_tokens = 37, n_embd = 259, n_y = 90;
  const auto y = test::random_floats(n_y * n_embd, rng);
  std::uniform_int_distribution<int> count(0, 5), row(0, n_y - 1);
  std::vector<int32_t> tok_offsets{0}, rows;
  std::vector<float> weights;
  std::uniform_real_distribution<float> wdist(0.01f, 1.0f);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int c = t % 7 == 3 ? 0 : count(rng);  // some tokens without any row
    for (int k = 0; k < c; ++k) {
      rows.push_back(row(rng));
      weights.push_back(wdist(rng));
    }
    tok_offsets.push_back(static_cast<int32_t>(rows.size()));
  }
  const auto dy = test::to_device(y), doff = test::to_device(tok_offsets),
             drows = test::to_device(rows), dw = test::to_device(weights);
  const auto base = test::random_floats(n_tokens * n_embd, rng);
  for (const bool accumulate : {false, true}) {
    const auto dout = test::to_device(base);
    combine_rows(dy.as<float>(), doff.as<int32_t>(), drows.as<int32_t>(), dw.as<float>(), n_tokens,
                 n_embd, accumulate, dout.as<float>(), nullptr);
    std::vector<float> want(base.size());
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t c = 0; c < n_embd; ++c) {
        float s = 0;
        for (int32_t k = tok_offsets[t]; k < tok_offsets[t + 1]; ++k) {
          s += weights[k] * y[rows[k] * n_embd + c];
        }
        const size_t i = static_cast<size_t>(t * n_embd + c);
        want[i] = accumulate ? base[i] + s : s;
      }
    }
    expect_close(test::to_host<float>(dout, base.size()), want, 1e-6, 0,
                 accumulate ? "combine (accumulate)" : "combine");
  }
}

TEST(OpsCuda, GetRowsIsBitExactWithTheCpuDecoder) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const GgmlType type : test::computable_types()) {
    const int64_t block = ggml_type_info_or_throw(type).block_size;
    const int64_t n_in = block == 1 ? 67 : 512, n_out = 11;
    std::vector<uint8_t> bytes;
    std::vector<float> values(static_cast<size_t>(n_in * n_out));
    for (int64_t o = 0; o < n_out; ++o) {
      const auto row = test::random_row(type, n_in, rng);
      bytes.insert(bytes.end(), row.begin(), row.end());
      cpu::dequantize_row(type, row.data(), values.data() + o * n_in, n_in);
    }
    const auto dw = test::to_device(bytes);
    const DeviceMatrix w = make_device_matrix(type, dw.get(), n_in, n_out);
    const std::vector<int32_t> ids = {3, 0, 10, 3, -1, 7, static_cast<int32_t>(n_out)};
    const auto dids = test::to_device(ids);
    const auto n = static_cast<int64_t>(ids.size());
    cuda::DeviceBuffer dout(static_cast<size_t>(n * n_in) * sizeof(float));
    get_rows(w, dids.as<int32_t>(), n, dout.as<float>(), nullptr);
    const auto out = test::to_host<float>(dout, static_cast<size_t>(n * n_in));
    const std::string name(ggml_type_info_or_throw(type).name);
    for (int64_t t = 0; t < n; ++t) {
      const float* got = out.data() + t * n_in;
      const int32_t id = ids[static_cast<size_t>(t)];
      if (id < 0 || id >= n_out) {
        EXPECT_TRUE(std::all_of(got, got + n_in, [](float v) { return std::isnan(v); }))
            << name << ": out-of-range id " << id << " must give NaN";
        continue;
      }
      EXPECT_EQ(std::memcmp(got, values.data() + id * n_in, static_cast<size_t>(n_in) * 4), 0)
          << name << ": row " << id << " differs from cpu::dequantize_row";
    }
  }
}

TEST(OpsCuda, RmsNormMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n_rows, n] : {std::pair<int64_t, int64_t>{5, 2048}, {96, 128}, {3, 67}}) {
    auto x = test::random_floats(n_rows * n, rng);
    for (auto& v : x) v *= 3.0f;
    const auto w = test::random_floats(n, rng);
    const auto dx = test::to_device(x), dw = test::to_device(w);
    cuda::DeviceBuffer dy(static_cast<size_t>(n_rows * n) * sizeof(float));
    rmsnorm(dx.as<float>(), dw.as<float>(), dy.as<float>(), n_rows, n, 1e-6f, nullptr);
    std::vector<float> want(x.size());
    model::rmsnorm_rows(x.data(), w.data(), want.data(), n_rows, n, 1e-6f);
    expect_close(test::to_host<float>(dy, x.size()), want, 1e-6, 0, "rmsnorm");
    rmsnorm(dx.as<float>(), dw.as<float>(), dx.as<float>(), n_rows, n, 1e-6f, nullptr);
    expect_close(test::to_host<float>(dx, x.size()), want, 1e-6, 0, "rmsnorm in place");
  }
}

// The residual add fused into the norm: x ends as x + delta exactly, and y equals rmsnorm() of
// that sum bit for bit.
TEST(OpsCuda, AddRmsNormEqualsAddThenRmsNorm) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n_rows, n] : {std::pair<int64_t, int64_t>{1, 2048}, {4, 4096}, {3, 67}}) {
    const auto x = test::random_floats(n_rows * n, rng), d = test::random_floats(n_rows * n, rng);
    const auto w = test::random_floats(n, rng);
    const auto dx = test::to_device(x), dd = test::to_device(d), dw = test::to_device(w);
    const auto size = static_cast<size_t>(n_rows * n);
    cuda::DeviceBuffer dy(size * sizeof(float)), dref(size * sizeof(float));
    add_rmsnorm(dx.as<float>(), dd.as<float>(), dw.as<float>(), dy.as<float>(), n_rows, n, 1e-6f,
                nullptr);
    std::vector<float> sum(size);
    for (size_t i = 0; i < size; ++i) sum[i] = x[i] + d[i];
    const auto got_x = test::to_host<float>(dx, size);
    EXPECT_EQ(got_x, sum) << n_rows << " x " << n;
    rmsnorm(dx.as<float>(), dw.as<float>(), dref.as<float>(), n_rows, n, 1e-6f, nullptr);
    EXPECT_EQ(test::to_host<float>(dy, size), test::to_host<float>(dref, size))
        << n_rows << " x " << n;
  }
}

// One token's combine fused with the next norm: the residual equals combine_rows' (accumulating)
// bit for bit, the norm rmsnorm's of it.
TEST(OpsCuda, CombineRmsNormEqualsCombineThenRmsNorm) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n, k] : {std::pair<int64_t, int32_t>{2048, 8}, {67, 3}, {1024, 1}}) {
    const auto y = test::random_floats(k * n, rng), x = test::random_floats(n, rng);
    const auto w = test::random_floats(n, rng), weights = test::random_floats(k, rng);
    std::vector<int32_t> rows(static_cast<size_t>(k)), offsets{0, k};
    std::iota(rows.begin(), rows.end(), 0);
    const auto dy = test::to_device(y), dwt = test::to_device(weights), dw = test::to_device(w);
    const auto drows = test::to_device(rows), doff = test::to_device(offsets);
    const auto dx = test::to_device(x), dx_ref = test::to_device(x);
    cuda::DeviceBuffer dout(static_cast<size_t>(n) * 4), dref(static_cast<size_t>(n) * 4);
    combine_rmsnorm(dy.as<float>(), dwt.as<float>(), k, dx.as<float>(), dw.as<float>(),
                    dout.as<float>(), n, 1e-6f, nullptr);
    combine_rows(dy.as<float>(), doff.as<int32_t>(), drows.as<int32_t>(), dwt.as<float>(), 1, n,
                 /*accumulate=*/true, dx_ref.as<float>(), nullptr);
    rmsnorm(dx_ref.as<float>(), dw.as<float>(), dref.as<float>(), 1, n, 1e-6f, nullptr);
    const auto size = static_cast<size_t>(n);
    EXPECT_EQ(test::to_host<float>(dx, size), test::to_host<float>(dx_ref, size)) << n;
    // The fused kernel sums the squares over more threads (another order of double additions).
    expect_close(test::to_host<float>(dout, size), test::to_host<float>(dref, size), 1e-6, 0,
                 "combine + rmsnorm " + std::to_string(n));
  }
}

TEST(OpsCuda, RopeNeoxMatchesCpu) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  struct Case {
    int64_t n_head, head_dim, n_rot, pos0;
    float base;
  };
  for (const Case c : {Case{4, 128, 128, 0, 1e6f}, Case{4, 128, 64, 1234, 10000.0f},
                       Case{2, 64, 32, 77, 500000.0f}, Case{3, 256, 64, 30000, 1e7f}}) {
    const int64_t n_tokens = 5;
    const int64_t row_stride = c.n_head * c.head_dim + 16;  // extra columns stay untouched
    const auto x = test::random_floats(n_tokens * row_stride, rng);
    const auto dx = test::to_device(x);
    rope_neox(dx.as<float>(), n_tokens, row_stride, c.n_head, c.head_dim, c.n_rot, c.pos0, c.base,
              nullptr);
    std::vector<float> want = x;
    std::vector<float> cs(static_cast<size_t>(c.n_rot));
    for (int64_t t = 0; t < n_tokens; ++t) {
      model::rope_angles(c.pos0 + t, c.n_rot, c.base, cs.data());
      model::rope_neox(want.data() + t * row_stride, c.n_head, c.head_dim, c.n_rot, cs.data());
    }
    const auto got = test::to_host<float>(dx, x.size());
    const std::string what =
        "rope n_rot " + std::to_string(c.n_rot) + " pos0 " + std::to_string(c.pos0);
    // cosf/sinf may differ from glibc's by an ulp or two; the angles themselves are identical.
    expect_close(got, want, 1e-6, 2e-6, what);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t col = 0; col < row_stride; ++col) {
        const bool rotated = col < c.n_head * c.head_dim && col % c.head_dim < c.n_rot;
        if (!rotated) {
          const size_t i = static_cast<size_t>(t * row_stride + col);
          ASSERT_EQ(got[i], x[i]) << what << ": column " << col << " must be untouched";
        }
      }
    }
  }
}

TEST(OpsCuda, RouterTopKMatchesCpuIncludingTies) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  for (const auto& [n_expert, k] :
       {std::pair<int64_t, int64_t>{128, 8}, {60, 4}, {1024, 32}, {8, 8}}) {
    const int64_t n_tokens = 6;
    // Distinct logits 0.01 apart (no near-ties that an ulp of expf could flip) ...
    std::vector<float> logits(static_cast<size_t>(n_tokens * n_expert));
    std::vector<int> perm(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t e = 0; e < n_expert; ++e) {
        logits[static_cast<size_t>(t * n_expert + e)] = 0.01f * static_cast<float>(perm[e]) - 3.0f;
      }
    }
    // ... plus exact ties: token 1 all equal; token 2 ties inside and across the top k.
    std::fill(logits.begin() + n_expert, logits.begin() + 2 * n_expert, 0.5f);
    float* t2 = logits.data() + 2 * n_expert;
    for (int64_t e = 0; e < n_expert; e += 3) t2[e] = 9.0f;
    for (int64_t e = 1; e < n_expert; e += 5) t2[e] = 8.0f;
    const auto dl = test::to_device(logits);
    cuda::DeviceBuffer dp(logits.size() * 4), di(static_cast<size_t>(n_tokens * k) * 4),
        dwt(static_cast<size_t>(n_tokens * k) * 4);
    router_topk(dl.as<float>(), n_tokens, n_expert, k, dp.as<float>(), di.as<int32_t>(),
                dwt.as<float>(), nullptr);
    const auto probs = test::to_host<float>(dp, logits.size());
    const auto ids = test::to_host<int32_t>(di, static_cast<size_t>(n_tokens * k));
    const auto weights = test::to_host<float>(dwt, static_cast<size_t>(n_tokens * k));
    std::vector<float> want_p(static_cast<size_t>(n_expert)), want_w(static_cast<size_t>(k));
    std::vector<int32_t> want_i(static_cast<size_t>(k));
    for (int64_t t = 0; t < n_tokens; ++t) {
      model::route_token(logits.data() + t * n_expert, n_expert, k, nullptr, want_p.data(),
                         want_i.data(), want_w.data());
      const std::string what =
          "n_expert " + std::to_string(n_expert) + " token " + std::to_string(t);
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

// The fused decode router: its logits equal matmul()'s bit for bit, its choice equals the CPU
// router's on those logits, and it gathers the chosen experts' pointers; launched repeatedly, the
// shared completion counter returns to zero each time.
TEST(OpsCuda, RouterDecodeMatchesMatmulAndCpuRouter) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  struct Case {
    GgmlType type;
    int64_t n_in, n_expert, k;
  };
  for (const Case& c : {Case{GgmlType::F32, 2048, 128, 8}, Case{GgmlType::F16, 512, 60, 4},
                        Case{GgmlType::BF16, 256, 256, 8}, Case{GgmlType::F32, 4096, 8, 8}}) {
    const std::string what = std::string(ggml_type_info_or_throw(c.type).name) + " " +
                             std::to_string(c.n_expert) + "x" + std::to_string(c.n_in);
    std::vector<uint8_t> wbytes;
    for (int64_t e = 0; e < c.n_expert; ++e) {
      const auto row = test::random_row(c.type, c.n_in, rng);
      wbytes.insert(wbytes.end(), row.begin(), row.end());
    }
    const auto dw = test::to_device(wbytes);
    const DeviceMatrix w = make_device_matrix(c.type, dw.get(), c.n_in, c.n_expert);
    // Fake expert pointers: only copied, never dereferenced.
    std::vector<uintptr_t> table(static_cast<size_t>(3 * c.n_expert));
    for (size_t i = 0; i < table.size(); ++i) table[i] = 0x100000 + 64 * i;
    const auto dtable = test::to_device(table);
    const auto n = static_cast<size_t>(c.n_expert), k = static_cast<size_t>(c.k);
    DeviceBuffer dlog(n * 4), dref(n * 4), dp(n * 4), di(k * 4), dwt(k * 4), dptr(3 * k * 8),
        dcount(4);
    ASSERT_EQ(cudaMemset(dcount.get(), 0, 4), cudaSuccess);
    const auto** gate = static_cast<const void**>(dptr.get());
    const RouterDecodeOut out{dlog.as<float>(),
                              dp.as<float>(),
                              di.as<int32_t>(),
                              dwt.as<float>(),
                              static_cast<const void* const*>(dtable.get()),
                              gate,
                              gate + k,
                              gate + 2 * k,
                              static_cast<unsigned*>(dcount.get())};
    for (int rep = 0; rep < 3; ++rep) {
      const auto dx = test::to_device(test::random_floats(c.n_in, rng));
      router_decode(w, dx.as<float>(), c.k, out, nullptr);
      matmul(w, dx.as<float>(), 1, dref.as<float>(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto logits = test::to_host<float>(dlog, n);
      EXPECT_EQ(logits, test::to_host<float>(dref, n)) << what << ": logits differ from matmul";
      std::vector<float> want_p(n), want_w(k);
      std::vector<int32_t> want_i(k);
      model::route_token(logits.data(), c.n_expert, c.k, nullptr, want_p.data(), want_i.data(),
                         want_w.data());
      const auto ids = test::to_host<int32_t>(di, k);
      EXPECT_EQ(ids, want_i) << what;
      expect_close(test::to_host<float>(dp, n), want_p, 1e-6, 1e-12, what + " probs");
      expect_close(test::to_host<float>(dwt, k), want_w, 2e-6, 1e-12, what + " weights");
      const auto ptrs = test::to_host<uintptr_t>(dptr, 3 * k);
      for (size_t j = 0; j < k; ++j) {
        const auto e = static_cast<size_t>(want_i[j]);
        EXPECT_EQ(ptrs[j], table[3 * e]) << what << " gate " << j;
        EXPECT_EQ(ptrs[k + j], table[3 * e + 1]) << what << " up " << j;
        EXPECT_EQ(ptrs[2 * k + j], table[3 * e + 2]) << what << " down " << j;
      }
      EXPECT_EQ(test::to_host<unsigned>(dcount, 1)[0], 0u) << what << ": counter not reset";
    }
  }
}

// Host-side argument checks (no GPU needed: they throw before any CUDA call).
TEST(OpsCuda, RejectsBadArguments) {
  auto* f = reinterpret_cast<float*>(uintptr_t{0x10000});
  auto* i32 = reinterpret_cast<int32_t*>(uintptr_t{0x20000});
  test::expect_error([&] { swiglu(f, f, f, -1, nullptr); }, "negative");
  test::expect_error([&] { swiglu(nullptr, f, f, 4, nullptr); }, "null");
  test::expect_error([&] { add_inplace(f, nullptr, 4, nullptr); }, "null");
  test::expect_error([&] { combine_rows(f, i32, i32, nullptr, 2, 8, false, f, nullptr); }, "null");
  test::expect_error([&] { rmsnorm(f, f, f, 2, 0, 1e-6f, nullptr); }, "shape");
  test::expect_error([&] { add_rmsnorm(f, f, f, f, 2, 8, 1e-6f, nullptr); }, "alias");
  test::expect_error([&] { combine_rmsnorm(f, f, 8, f, f, f + 64, 4096, 1e-6f, nullptr); }, "4096");
  test::expect_error([&] { combine_rmsnorm(f, f, 8, f, f, f, 64, 1e-6f, nullptr); }, "alias");
  test::expect_error([&] { add_rmsnorm(f, nullptr, f, f + 64, 2, 8, 1e-6f, nullptr); }, "null");
  test::expect_error([&] { rope_neox(f, 1, 128, 1, 128, 63, 0, 1e4f, nullptr); }, "n_rot");
  test::expect_error([&] { rope_neox(f, 1, 128, 1, 128, 256, 0, 1e4f, nullptr); }, "n_rot");
  test::expect_error([&] { rope_neox(f, 1, 100, 1, 128, 64, 0, 1e4f, nullptr); }, "row_stride");
  test::expect_error([&] { router_topk(f, 1, 128, 33, f, i32, f, nullptr); }, "k 33");
  test::expect_error([&] { router_topk(f, 1, 2048, 8, f, i32, f, nullptr); }, "n_expert");
  test::expect_error([&] { router_topk(f, 1, 4, 8, f, i32, f, nullptr); }, "k 8");
  const DeviceMatrix rw = make_device_matrix(GgmlType::F32, f, 64, 16);
  const auto** pp = reinterpret_cast<const void**>(f);
  const RouterDecodeOut ro{f, f, i32, f, pp, pp, pp, pp, reinterpret_cast<unsigned*>(i32)};
  test::expect_error([&] { router_decode(rw, f, 17, ro, nullptr); }, "k 17");
  test::expect_error([&] { router_decode(rw, nullptr, 8, ro, nullptr); }, "null");
  test::expect_error(
      [&] { router_decode(make_device_matrix(GgmlType::Q8_0, f, 64, 16), f, 8, ro, nullptr); },
      "q8_0");
  const DeviceMatrix w = make_device_matrix(GgmlType::Q8_0, f, 32, 4);
  test::expect_error([&] { get_rows(w, nullptr, 2, f, nullptr); }, "null");
  DeviceMatrix bad = w;
  bad.type = GgmlType::IQ2_XXS;
  test::expect_error([&] { get_rows(bad, i32, 2, f, nullptr); }, "not supported");
}

}  // namespace
}  // namespace moe::cuda
