// The fused q/k RMSNorm + RoPE against the separate GPU kernels (bit for bit) and the CPU
// implementations, on fresh random data; and its argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/random_blocks.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/qk_norm_rope.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

struct Case {
  int64_t n_tokens, n_head, n_head_kv, head_dim, n_rot, pos0;
  float base;
};

TEST(QkNormRopeCuda, EqualsSeparateKernelsAndMatchesCpu) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  for (const Case c : {Case{1, 32, 4, 128, 128, 517, 1e6f}, Case{7, 16, 2, 256, 64, 0, 1e7f},
                       Case{3, 5, 5, 64, 32, 30000, 10000.0f}, Case{2, 4, 1, 96, 96, 9, 5e5f}}) {
    const std::string what = "heads " + std::to_string(c.n_head) + "/" +
                             std::to_string(c.n_head_kv) + " dim " + std::to_string(c.head_dim) +
                             " n_rot " + std::to_string(c.n_rot);
    const int64_t qs = c.n_head * c.head_dim + 8, ks = c.n_head_kv * c.head_dim;  // q padded
    auto q = test::random_floats(c.n_tokens * qs, rng);
    auto k = test::random_floats(c.n_tokens * ks, rng);
    for (auto& v : q) v *= 3.0f;
    const auto qw = test::random_floats(c.head_dim, rng), kw = test::random_floats(c.head_dim, rng);
    const float eps = 1e-6f;
    const auto dq = test::to_device(q), dk = test::to_device(k);
    const auto dq2 = test::to_device(q), dk2 = test::to_device(k);
    const auto dqw = test::to_device(qw), dkw = test::to_device(kw);
    qk_norm_rope({dq.as<float>(), qs, c.n_head, dqw.as<float>()},
                 {dk.as<float>(), ks, c.n_head_kv, dkw.as<float>()}, c.n_tokens, c.head_dim, eps,
                 c.n_rot, c.pos0, c.base, nullptr);
    // The separate kernels, head by head for q's padded rows.
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      rmsnorm(dq2.as<float>() + t * qs, dqw.as<float>(), dq2.as<float>() + t * qs, c.n_head,
              c.head_dim, eps, nullptr);
    }
    rmsnorm(dk2.as<float>(), dkw.as<float>(), dk2.as<float>(), c.n_tokens * c.n_head_kv, c.head_dim,
            eps, nullptr);
    rope_neox(dq2.as<float>(), c.n_tokens, qs, c.n_head, c.head_dim, c.n_rot, c.pos0, c.base,
              nullptr);
    rope_neox(dk2.as<float>(), c.n_tokens, ks, c.n_head_kv, c.head_dim, c.n_rot, c.pos0, c.base,
              nullptr);
    const auto gq = test::to_host<float>(dq, q.size()), gk = test::to_host<float>(dk, k.size());
    const auto sq = test::to_host<float>(dq2, q.size()), sk = test::to_host<float>(dk2, k.size());
    EXPECT_EQ(std::memcmp(gq.data(), sq.data(), q.size() * sizeof(float)), 0) << what;
    EXPECT_EQ(std::memcmp(gk.data(), sk.data(), k.size() * sizeof(float)), 0) << what;

    // The position read on the device (CUDA graphs; the host passes 0): the same bits.
    const auto dq3 = test::to_device(q), dk3 = test::to_device(k);
    const auto dpos = test::to_device(std::vector<int32_t>{static_cast<int32_t>(c.pos0)});
    qk_norm_rope({dq3.as<float>(), qs, c.n_head, dqw.as<float>()},
                 {dk3.as<float>(), ks, c.n_head_kv, dkw.as<float>()}, c.n_tokens, c.head_dim, eps,
                 c.n_rot, 0, c.base, nullptr, dpos.as<int32_t>());
    EXPECT_EQ(test::to_host<float>(dq3, q.size()), gq) << what << ", device position";
    EXPECT_EQ(test::to_host<float>(dk3, k.size()), gk) << what << ", device position";

    // The CPU: RMSNorm per head, then RoPE; q's padding columns untouched.
    std::vector<float> wq = q, wk = k, cs(static_cast<size_t>(c.n_rot));
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      float* qr = wq.data() + t * qs;
      float* kr = wk.data() + t * ks;
      model::rmsnorm_rows(qr, qw.data(), qr, c.n_head, c.head_dim, eps);
      model::rmsnorm_rows(kr, kw.data(), kr, c.n_head_kv, c.head_dim, eps);
      model::rope_angles(c.pos0 + t, c.n_rot, c.base, cs.data());
      model::rope_neox(qr, c.n_head, c.head_dim, c.n_rot, cs.data());
      model::rope_neox(kr, c.n_head_kv, c.head_dim, c.n_rot, cs.data());
    }
    const auto close = [&](const std::vector<float>& got, const std::vector<float>& want,
                           const char* which) {
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
        // cosf/sinf may differ from glibc's by an ulp or two; the angles are identical.
        if (!(d <= 2e-6 * std::fabs(want[i]) + 4e-6) && bad++ < 5) {
          ADD_FAILURE() << what << " " << which << "[" << i << "]: " << got[i] << " vs " << want[i];
        }
      }
    };
    close(gq, wq, "q");
    close(gk, wk, "k");
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      for (int64_t col = c.n_head * c.head_dim; col < qs; ++col) {
        const auto i = static_cast<size_t>(t * qs + col);
        ASSERT_EQ(gq[i], q[i]) << what << ": padding column " << col << " must be untouched";
      }
    }
  }
}

// The f16 K/V store riding on the launch writes the bytes kv_store() writes from the same rows,
// at a host position and at a device one; a device position past the cache writes nothing.
TEST(QkNormRopeCuda, FusedF16StoreEqualsKvStore) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const int64_t H = 8, HK = 2, hd = 128, hv = 64, n_ctx = 12;
  const int64_t S = H * hd + HK * hd + HK * hv;  // q, k and v side by side, as the stacked GEMV
  DeviceKvLayer kv{};
  kv.k_type = kv.v_type = GgmlType::F16;
  kv.k_elems = HK * hd;
  kv.v_elems = HK * hv;
  kv.k_row_bytes = static_cast<size_t>(2 * kv.k_elems);
  kv.v_row_bytes = static_cast<size_t>(2 * kv.v_elems);
  kv.n_ctx = n_ctx;
  const auto qw = test::random_floats(hd, rng), kw = test::random_floats(hd, rng);
  const auto dqw = test::to_device(qw), dkw = test::to_device(kw);
  for (const int64_t n : {1, 3}) {
    for (const bool on_device : {false, true}) {
      const int64_t pos0 = 5;
      const auto rows = test::random_floats(n * S, rng);
      const auto d1 = test::to_device(rows), d2 = test::to_device(rows);
      const auto dpos = test::to_device(std::vector<int32_t>{static_cast<int32_t>(pos0)});
      const int32_t* dp = on_device ? dpos.as<int32_t>() : nullptr;
      cuda::DeviceBuffer kc1(kv.k_row_bytes * n_ctx), vc1(kv.v_row_bytes * n_ctx),
          kc2(kv.k_row_bytes * n_ctx), vc2(kv.v_row_bytes * n_ctx);
      for (auto* b : {&kc1, &vc1, &kc2, &vc2})
        MOE_CUDA_CHECK(cudaMemset(b->get(), 0x7C, b->size()));
      float* r1 = d1.as<float>();
      float* r2 = d2.as<float>();
      const QkKvStoreF16 store{
          kc1.get(), vc1.get(), kv.k_row_bytes, kv.v_row_bytes, n_ctx, r1 + (H + HK) * hd, S, hv};
      qk_norm_rope({r1, S, H, dqw.as<float>()}, {r1 + H * hd, S, HK, dkw.as<float>()}, n, hd, 1e-6f,
                   hd, on_device ? 0 : pos0, 1e6f, nullptr, dp, &store);
      qk_norm_rope({r2, S, H, dqw.as<float>()}, {r2 + H * hd, S, HK, dkw.as<float>()}, n, hd, 1e-6f,
                   hd, on_device ? 0 : pos0, 1e6f, nullptr, dp);
      DeviceKvLayer kv2 = kv;
      kv2.k = kc2.get();
      kv2.v = vc2.get();
      kv_store(kv2, r2 + H * hd, r2 + (H + HK) * hd, n, on_device ? 0 : pos0, nullptr, dp, S, S);
      const std::string what = std::to_string(n) + " tokens, device position " +
                               std::to_string(static_cast<int>(on_device));
      EXPECT_EQ(test::to_host<float>(d1, rows.size()), test::to_host<float>(d2, rows.size()))
          << what;
      EXPECT_EQ(test::to_host<uint8_t>(kc1, kc1.size()), test::to_host<uint8_t>(kc2, kc2.size()))
          << what;
      EXPECT_EQ(test::to_host<uint8_t>(vc1, vc1.size()), test::to_host<uint8_t>(vc2, vc2.size()))
          << what;
    }
  }
  // A device position that would write past the cache writes nothing.
  const auto rows = test::random_floats(2 * S, rng);
  const auto d = test::to_device(rows);
  const auto dbad = test::to_device(std::vector<int32_t>{static_cast<int32_t>(n_ctx - 1)});
  cuda::DeviceBuffer kc(kv.k_row_bytes * n_ctx), vc(kv.v_row_bytes * n_ctx);
  MOE_CUDA_CHECK(cudaMemset(kc.get(), 0x7C, kc.size()));
  MOE_CUDA_CHECK(cudaMemset(vc.get(), 0x7C, vc.size()));
  const QkKvStoreF16 store{
      kc.get(), vc.get(), kv.k_row_bytes, kv.v_row_bytes, n_ctx, d.as<float>() + (H + HK) * hd,
      S,        hv};
  qk_norm_rope({d.as<float>(), S, H, dqw.as<float>()},
               {d.as<float>() + H * hd, S, HK, dkw.as<float>()}, 2, hd, 1e-6f, hd, 0, 1e6f, nullptr,
               dbad.as<int32_t>(), &store);
  for (const auto* b : {&kc, &vc}) {
    for (const uint8_t byte : test::to_host<uint8_t>(*b, b->size())) ASSERT_EQ(byte, 0x7C);
  }
}

// gpt-oss: no q/k norm (null gains: RoPE only) and YaRN angles, against the CPU's
// rope_angles_yarn + rope_neox, at positions around and far past the original context, with and
// without the fused f16 K/V store, at a host and at a device position.
TEST(QkNormRopeCuda, YarnWithoutNormMatchesCpu) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t H = 64, HK = 8, hd = 64, n_rot = 64;
  const float base = 150000.0f;
  const model::RopeYarn yarn =
      model::rope_yarn_params(n_rot, base, 32.0f, 4096, 32.0f, 1.0f, 1.0f, /*yarn=*/true);
  ASSERT_NE(yarn.mscale, 1.0f);  // the parameters do reach the YaRN path
  ASSERT_LT(yarn.corr_low, yarn.corr_high);
  const int64_t S = H * hd + HK * hd + HK * hd + 4;  // q, k, v side by side, and padding
  struct Batch {
    int64_t n, pos0;
  };
  for (const Batch b : {Batch{1, 0}, Batch{1, 1}, Batch{1, 4095}, Batch{1, 4096}, Batch{1, 100000},
                        Batch{3, 4094}}) {
    for (const bool with_store : {false, true}) {
      for (const bool on_device : {false, true}) {
        const std::string what = std::to_string(b.n) + " tokens at " + std::to_string(b.pos0) +
                                 (with_store ? ", store" : "") +
                                 (on_device ? ", device position" : "");
        const int64_t n_ctx = b.pos0 + b.n + 2;
        const auto rows = test::random_floats(b.n * S, rng);
        const auto d = test::to_device(rows);
        float* r = d.as<float>();
        const auto dpos = test::to_device(std::vector<int32_t>{static_cast<int32_t>(b.pos0)});
        const int32_t* dp = on_device ? dpos.as<int32_t>() : nullptr;
        const size_t k_row = 2 * HK * hd, v_row = 2 * HK * hd;
        cuda::DeviceBuffer kc(with_store ? k_row * static_cast<size_t>(n_ctx) : 0);
        cuda::DeviceBuffer vc(with_store ? v_row * static_cast<size_t>(n_ctx) : 0);
        const QkKvStoreF16 store{kc.get(), vc.get(), k_row, v_row, n_ctx, r + (H + HK) * hd, S, hd};
        qk_norm_rope({r, S, H, nullptr}, {r + H * hd, S, HK, nullptr}, b.n, hd, 1e-6f, n_rot,
                     on_device ? 0 : b.pos0, base, nullptr, dp, with_store ? &store : nullptr,
                     &yarn);
        const auto got = test::to_host<float>(d, rows.size());

        // The CPU: angles per position, q and k heads rotated, everything else untouched.
        std::vector<float> want = rows, cs(static_cast<size_t>(n_rot));
        for (int64_t t = 0; t < b.n; ++t) {
          model::rope_angles_yarn(b.pos0 + t, n_rot, base, yarn, cs.data());
          model::rope_neox(want.data() + t * S, H + HK, hd, n_rot, cs.data());
        }
        int bad = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
          // cosf/sinf may differ from glibc's by an ulp or two; the angles are identical.
          if (!(e <= 2e-6 * std::fabs(want[i]) + 4e-6) && bad++ < 5) {
            ADD_FAILURE() << what << ": [" << i << "] " << got[i] << " vs " << want[i];
          }
        }
        // Not the plain angles: YaRN's rotation and scale differ from them.
        std::vector<float> plain = rows;
        model::rope_angles(b.pos0, n_rot, base, cs.data());
        model::rope_neox(plain.data(), H + HK, hd, n_rot, cs.data());
        double moved = 0;  // over token 0's first q head
        for (int64_t i = 0; i < hd; ++i) moved += std::fabs(got[i] - plain[i]);
        EXPECT_GT(moved, 1e-2) << what;
        if (!with_store) continue;
        // The stored rows are the k rows left in place and the given v rows, as kv_store writes.
        DeviceKvLayer kv{};
        kv.k_type = kv.v_type = GgmlType::F16;
        kv.k_elems = kv.v_elems = HK * hd;
        kv.k_row_bytes = k_row;
        kv.v_row_bytes = v_row;
        kv.n_ctx = n_ctx;
        cuda::DeviceBuffer kc2(kc.size()), vc2(vc.size());
        kv.k = kc2.get();
        kv.v = vc2.get();
        kv_store(kv, r + H * hd, r + (H + HK) * hd, b.n, b.pos0, nullptr, nullptr, S, S);
        const size_t from = k_row * static_cast<size_t>(b.pos0);
        const size_t bytes = k_row * static_cast<size_t>(b.n);
        const auto k1 = test::to_host<uint8_t>(kc, kc.size()),
                   k2 = test::to_host<uint8_t>(kc2, kc.size());
        const auto v1 = test::to_host<uint8_t>(vc, vc.size()),
                   v2 = test::to_host<uint8_t>(vc2, vc.size());
        EXPECT_EQ(std::memcmp(k1.data() + from, k2.data() + from, bytes), 0) << what;
        EXPECT_EQ(std::memcmp(v1.data() + from, v2.data() + from, bytes), 0) << what;
      }
    }
  }
}

// Null gains leave a side un-normalised: RoPE alone, bit for bit the rope_neox kernel's; and the
// identity YaRN (freq_scale 1, no ramp, mscale 1) gives the plain angles' bits. One side may keep
// its norm.
TEST(QkNormRopeCuda, NullNormIsRopeAlone) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const int64_t n = 5, H = 8, HK = 2, hd = 128, n_rot = 64, pos0 = 777;
  const float base = 1e6f;
  const int64_t qs = H * hd + 8, ks = HK * hd;
  const auto q = test::random_floats(n * qs, rng), k = test::random_floats(n * ks, rng);
  const auto kw = test::random_floats(hd, rng);
  const auto dkw = test::to_device(kw);
  const model::RopeYarn identity{};
  for (const model::RopeYarn* y : {static_cast<const model::RopeYarn*>(nullptr), &identity}) {
    const auto dq = test::to_device(q), dk = test::to_device(k);
    const auto dq2 = test::to_device(q), dk2 = test::to_device(k);
    qk_norm_rope({dq.as<float>(), qs, H, nullptr}, {dk.as<float>(), ks, HK, dkw.as<float>()}, n, hd,
                 1e-6f, n_rot, pos0, base, nullptr, nullptr, nullptr, y);
    rope_neox(dq2.as<float>(), n, qs, H, hd, n_rot, pos0, base, nullptr);
    rmsnorm(dk2.as<float>(), dkw.as<float>(), dk2.as<float>(), n * HK, hd, 1e-6f, nullptr);
    rope_neox(dk2.as<float>(), n, ks, HK, hd, n_rot, pos0, base, nullptr);
    const std::string what = y ? "identity yarn" : "no yarn";
    EXPECT_EQ(test::to_host<float>(dq, q.size()), test::to_host<float>(dq2, q.size())) << what;
    EXPECT_EQ(test::to_host<float>(dk, k.size()), test::to_host<float>(dk2, k.size())) << what;
    EXPECT_NE(test::to_host<float>(dq, q.size()), q) << what;  // it did rotate
  }
}

TEST(QkNormRopeCuda, RejectsBadArguments) {
  float dummy = 0;
  const QkHeads q{&dummy, 128, 1, &dummy}, k{&dummy, 128, 1, &dummy};
  test::expect_error([&] { qk_norm_rope(q, k, 1, 128, 1e-6f, 63, 0, 1e4f, nullptr); }, "n_rot");
  test::expect_error([&] { qk_norm_rope(q, k, 1, 128, 1e-6f, 256, 0, 1e4f, nullptr); }, "n_rot");
  test::expect_error([&] { qk_norm_rope(q, k, -1, 128, 1e-6f, 64, 0, 1e4f, nullptr); },
                     "invalid shape");
  test::expect_error(
      [&] {
        qk_norm_rope({&dummy, 100, 1, &dummy}, k, 1, 128, 1e-6f, 64, 0, 1e4f, nullptr);
      },
      "heads");
  test::expect_error(
      [&] {
        qk_norm_rope(q, {nullptr, 128, 1, &dummy}, 1, 128, 1e-6f, 64, 0, 1e4f, nullptr);
      },
      "null");
  const QkKvStoreF16 store{&dummy, &dummy, 256, 256, 4, &dummy, 128, 128};
  test::expect_error(
      [&] { qk_norm_rope(q, k, 2, 128, 1e-6f, 64, 3, 1e4f, nullptr, nullptr, &store); },
      "context length");
  QkKvStoreF16 narrow = store;
  narrow.k_row_bytes = 200;
  test::expect_error(
      [&] { qk_norm_rope(q, k, 1, 128, 1e-6f, 64, 0, 1e4f, nullptr, nullptr, &narrow); },
      "cache rows");
}

}  // namespace
}  // namespace moe::cuda
