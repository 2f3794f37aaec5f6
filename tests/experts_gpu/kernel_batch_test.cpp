// Recorded expert launches: a replay gives the bits of the same kernels called directly (on fresh
// random data), and a received batch with an unknown op or weight type is refused before anything
// is launched.
#include "experts/gpu/kernel_batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rmsnorm.h"
#include "tests/cuda/gpu_test_env.h"

namespace {

using namespace moe;
using moe::gpu::KernelBatch;
using moe::gpu::KernelCall;
using moe::gpu::KernelOp;

TEST(KernelBatch, RefusesUnknownOpsAndTypes) {
  KernelBatch b;
  b.swiglu(nullptr, nullptr, nullptr, 0);
  std::vector<KernelCall> calls(b.calls().begin(), b.calls().end());
  EXPECT_EQ(KernelBatch::from(calls).calls().size(), 1u);
  calls[0].op = static_cast<KernelOp>(0);
  EXPECT_THROW(KernelBatch::from(calls), Error);
  calls[0].op = static_cast<KernelOp>(77);
  try {
    KernelBatch::from(calls);
    FAIL() << "op 77 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("77"), std::string::npos) << e.what();
  }
  calls[0].op = KernelOp::Swiglu;
  calls[0].type = 100000;
  EXPECT_THROW(KernelBatch::from(calls), Error);
}

TEST(KernelBatch, ReplayEqualsDirectLaunches) {
  MOE_REQUIRE_GPU();
  constexpr int64_t kTokens = 3, kK = 4, kEmbd = 1024;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const auto fresh = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  };
  const auto g = fresh(kTokens * kK * kEmbd), u = fresh(g.size()), w = fresh(kTokens * kK);
  const auto x0 = fresh(kTokens * kEmbd), gains = fresh(kEmbd);
  std::vector<int32_t> tok_off(kTokens + 1), rows(kTokens * kK);
  for (int64_t t = 0; t <= kTokens; ++t) tok_off[t] = static_cast<int32_t>(t * kK);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(rows.size() - 1 - i);
  const auto dg = test::to_device(g), du = test::to_device(u), dw = test::to_device(w);
  const auto dgains = test::to_device(gains);
  const auto doff = test::to_device(tok_off), drows = test::to_device(rows);
  const auto run = [&](bool recorded) {
    const auto h = test::to_device(std::vector<float>(g.size()));
    const auto x = test::to_device(x0);
    const auto normed = test::to_device(std::vector<float>(kEmbd));
    const auto* pg = dg.as<float>();
    const auto* pu = du.as<float>();
    const auto* pw = dw.as<float>();
    const auto* po = doff.as<int32_t>();
    const auto* pr = drows.as<int32_t>();
    const auto n = static_cast<int64_t>(g.size());
    if (recorded) {
      KernelBatch b;
      b.swiglu(pg, pu, h.as<float>(), n);
      b.combine_rows(h.as<float>(), po, pr, pw, kTokens, kEmbd, true, x.as<float>());
      b.combine_rmsnorm(h.as<float>(), pw, kK, x.as<float>(), dgains.as<float>(),
                        normed.as<float>(), kEmbd, 1e-6f);
      EXPECT_EQ(b.calls().size(), 3u);
      b.replay(nullptr);
    } else {
      cuda::swiglu(pg, pu, h.as<float>(), n, nullptr);
      cuda::combine_rows(h.as<float>(), po, pr, pw, kTokens, kEmbd, true, x.as<float>(), nullptr);
      cuda::combine_rmsnorm(h.as<float>(), pw, kK, x.as<float>(), dgains.as<float>(),
                            normed.as<float>(), kEmbd, 1e-6f, nullptr);
    }
    return std::vector<std::vector<float>>{test::to_host<float>(h, g.size()),
                                           test::to_host<float>(x, x0.size()),
                                           test::to_host<float>(normed, kEmbd)};
  };
  const auto direct = run(false), replayed = run(true);
  for (size_t i = 0; i < direct.size(); ++i) {
    ASSERT_EQ(direct[i].size(), replayed[i].size());
    EXPECT_EQ(0, std::memcmp(direct[i].data(), replayed[i].data(), direct[i].size() * 4))
        << "output " << i;
  }
  // Not a vacuous comparison: the outputs moved away from their inputs.
  EXPECT_NE(direct[1], x0);
}

}  // namespace
