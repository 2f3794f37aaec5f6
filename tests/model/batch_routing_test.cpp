// The router's top k against a brute-force ranking (probability descending, ties to the lower
// id), with ties in the logits and more experts than the chosen-bit mask holds; and a batch
// routed on a thread pool equal to the same batch routed on one thread, bit for bit.
#include "coordinator/model/batch_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/router.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {
namespace {

std::vector<float> random_logits(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  // Rounded to quarters: many exact ties, which must go to the lower expert id.
  for (float& x : v) x = std::round(nd(rng) * 4.0f) / 4.0f;
  return v;
}

TEST(Router, TopKIsTheRankingByProbabilityThenId) {
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  for (const int64_t n_expert : {8, 60, 128, 256, 600}) {  // 600: past the 512-bit mask
    for (const int64_t k : {1, 4, 8}) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> logits = random_logits(n_expert, rng);
        std::vector<float> probs(static_cast<size_t>(n_expert)), w(static_cast<size_t>(k));
        std::vector<int32_t> ids(static_cast<size_t>(k));
        route_token(logits.data(), n_expert, k, nullptr, probs.data(), ids.data(), w.data());
        std::vector<int32_t> order(static_cast<size_t>(n_expert));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
          return probs[static_cast<size_t>(a)] > probs[static_cast<size_t>(b)];
        });
        order.resize(static_cast<size_t>(k));
        ASSERT_EQ(ids, order) << n_expert << " experts, k " << k;
        float sum = 0;
        for (float x : w) sum += x;
        EXPECT_NEAR(sum, 1.0f, 1e-5f);
      }
    }
  }
}

TEST(RouteBatch, OnAPoolEqualsOneThread) {
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const int64_t n = 300, X = 128, K = 8;  // not a multiple of the pool's token chunk
  const std::vector<float> logits = random_logits(n * X, rng);
  std::vector<float> p1(static_cast<size_t>(n * X)), p2(p1.size()), w1(static_cast<size_t>(n * K)),
      w2(w1.size());
  std::vector<int32_t> i1(static_cast<size_t>(n * K)), i2(i1.size()), forced(K);
  route_batch(logits.data(), n, X, K, 0, 0, nullptr, forced.data(), p1.data(), i1.data(),
              w1.data());
  cpu::ThreadPool pool(3);
  route_batch(logits.data(), n, X, K, 0, 0, nullptr, forced.data(), p2.data(), i2.data(), w2.data(),
              &pool);
  EXPECT_EQ(i1, i2);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(w1, w2);
  // A force_experts hook keeps the batch on the calling thread, and its choice is taken.
  ForwardHooks hooks;
  hooks.force_experts = [&](int64_t, int64_t pos, int32_t* out) {
    for (int64_t j = 0; j < K; ++j) out[j] = static_cast<int32_t>((pos + j) % X);
    return true;
  };
  route_batch(logits.data(), n, X, K, 0, 0, &hooks, forced.data(), p2.data(), i2.data(), w2.data(),
              &pool);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      ASSERT_EQ(i2[static_cast<size_t>(t * K + j)], static_cast<int32_t>((t + j) % X));
    }
  }
}

}  // namespace
}  // namespace moe::model
