// publish_split_routing (a device-routed split layer's hand-off) against a host reference on fresh
// random routing: the hit lists for combine_rows keep routing order per token, the page-locked
// copies of ids, weights, hit marks and the input rows match, and the flag carries the sequence
// number once all of it is there. group_items_by_expert (a device-routed batch grouped by expert)
// against the counts and the items it was given. Argument checks run without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/expert_lists.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

// Page-locked host memory the kernel writes (freed at scope end).
template <class T>
struct Pinned {
  explicit Pinned(size_t n) : n(n) {
    MOE_CUDA_CHECK(
        cudaHostAlloc(reinterpret_cast<void**>(&p), n * sizeof(T) + 64, cudaHostAllocDefault));
    for (size_t i = 0; i < n; ++i) p[i] = T{};
  }
  ~Pinned() { (void)cudaFreeHost(p); }
  T* p = nullptr;
  size_t n;
};

struct Shape {
  int64_t tokens, k, embd;
};

class PublishSplitRouting : public ::testing::TestWithParam<Shape> {};

TEST_P(PublishSplitRouting, MatchesTheHostReference) {
  MOE_REQUIRE_GPU();
  const Shape c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t items = c.tokens * c.k;
  std::vector<int32_t> ids(static_cast<size_t>(items));
  std::vector<float> w(ids.size()), x(static_cast<size_t>(c.tokens * c.embd));
  std::vector<const void*> gate(ids.size());
  std::uniform_int_distribution<int32_t> expert(0, 127);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  static const char kSlot = 0;  // any non-null address stands for a VRAM copy
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = expert(rng);
    w[i] = u(rng);
    gate[i] = (rng() % 3 == 0) ? nullptr : &kSlot;
  }
  for (float& v : x) v = u(rng);
  const auto d_ids = test::to_device(ids), d_w = test::to_device(w), d_x = test::to_device(x);
  const auto d_gate = test::to_device(gate);
  DeviceBuffer d_tok(static_cast<size_t>(c.tokens + 1) * 4), d_rows(ids.size() * 4),
      d_hw(ids.size() * 4);
  Pinned<int32_t> h_ids(ids.size());
  Pinned<float> h_w(ids.size()), h_x(x.size());
  Pinned<uint8_t> h_hit(ids.size());
  Pinned<uint32_t> flag(1);
  const uint32_t seq = 0x80000001u + static_cast<uint32_t>(rng() % 1000);
  publish_split_routing(d_ids.as<int32_t>(), d_w.as<float>(),
                        static_cast<const void* const*>(d_gate.get()), c.tokens, c.k,
                        d_x.as<float>(), c.embd, seq,
                        {d_tok.as<int32_t>(), d_rows.as<int32_t>(), d_hw.as<float>(), h_ids.p,
                         h_w.p, h_hit.p, h_x.p, flag.p},
                        nullptr);
  // The flag arrives without a synchronisation (the runner polls it); then everything is there.
  while (__atomic_load_n(flag.p, __ATOMIC_ACQUIRE) != seq) {
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(h_ids.p[i], ids[i]) << i;
    ASSERT_EQ(h_w.p[i], w[i]) << i;
    ASSERT_EQ(h_hit.p[i], gate[i] ? 1 : 0) << i;
  }
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h_x.p[i], x[i]) << i;
  const auto tok = test::to_host<int32_t>(d_tok, static_cast<size_t>(c.tokens + 1));
  const auto rows = test::to_host<int32_t>(d_rows, ids.size());
  const auto hw = test::to_host<float>(d_hw, ids.size());
  int32_t n = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    ASSERT_EQ(tok[static_cast<size_t>(t)], n) << "token " << t;
    for (int64_t j = 0; j < c.k; ++j) {
      const auto i = static_cast<size_t>(t * c.k + j);
      if (!gate[i]) continue;
      ASSERT_EQ(rows[static_cast<size_t>(n)], static_cast<int32_t>(i));
      ASSERT_EQ(hw[static_cast<size_t>(n)], w[i]);
      ++n;
    }
  }
  EXPECT_EQ(tok[static_cast<size_t>(c.tokens)], n);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PublishSplitRouting,
                         ::testing::Values(Shape{1, 8, 2048}, Shape{4, 8, 4096}, Shape{3, 6, 257},
                                           Shape{2, 1, 1}));

TEST(PublishSplitRoutingArgs, RejectsBadArguments) {
  int32_t ids = 0;
  float w = 0, x = 0;
  const void* gate = nullptr;
  int32_t tok[2], rows[1];
  uint8_t hit = 0;
  uint32_t flag = 0;
  const SplitRoutingOut ok{tok, rows, &w, &ids, &w, &hit, &x, &flag};
  test::expect_error([&] { publish_split_routing(&ids, &w, &gate, 0, 8, &x, 4, 1, ok, nullptr); },
                     "invalid sizes");
  test::expect_error([&] { publish_split_routing(&ids, &w, &gate, 129, 8, &x, 4, 1, ok, nullptr); },
                     "invalid sizes");
  test::expect_error([&] { publish_split_routing(&ids, &w, &gate, 1, 0, &x, 4, 1, ok, nullptr); },
                     "invalid sizes");
  SplitRoutingOut no_flag = ok;
  no_flag.host_flag = nullptr;
  test::expect_error(
      [&] { publish_split_routing(&ids, &w, &gate, 1, 1, &x, 4, 1, no_flag, nullptr); },
      "null pointer");
  test::expect_error(
      [&] { publish_split_routing(nullptr, &w, &gate, 1, 1, &x, 4, 1, ok, nullptr); },
      "null pointer");
}

// Every item lands in its expert's range exactly once, with its token and expert beside it; the
// offsets are the counts' running sums. 512 tokens x 8 of 128 experts (a prefill layer), a few
// tokens, one expert, and ids outside the range (counted as expert 0).
TEST(GroupItemsByExpert, EveryItemInItsExpertsRangeOnce) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Case {
    int64_t tokens, k, experts;
    bool bad_ids;
  };
  for (const Case c : {Case{512, 8, 128, false}, Case{5, 8, 128, false}, Case{33, 4, 32, false},
                       Case{7, 1, 1, false}, Case{20, 2, 16, true}}) {
    const int64_t n = c.tokens * c.k;
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.experts - 1));
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& e : ids) e = pick(rng);
    if (c.bad_ids) {
      ids[0] = -3;
      ids[1] = static_cast<int32_t>(c.experts);
    }
    const auto d_ids = test::to_device(ids);
    DeviceBuffer off((c.experts + 1) * 4), xr(n * 4), re(n * 4), pos(n * 4);
    group_items_by_expert(d_ids.as<int32_t>(), n, c.k, c.experts, off.as<int32_t>(),
                          xr.as<int32_t>(), re.as<int32_t>(), pos.as<int32_t>(), nullptr);
    const auto h_off = test::to_host<int32_t>(off, static_cast<size_t>(c.experts + 1));
    const auto h_xr = test::to_host<int32_t>(xr, static_cast<size_t>(n));
    const auto h_re = test::to_host<int32_t>(re, static_cast<size_t>(n));
    const auto h_pos = test::to_host<int32_t>(pos, static_cast<size_t>(n));
    std::vector<int32_t> count(static_cast<size_t>(c.experts), 0);
    const auto expert_of = [&](int32_t id) { return id >= 0 && id < c.experts ? id : 0; };
    for (const int32_t id : ids) ++count[static_cast<size_t>(expert_of(id))];
    int32_t sum = 0;
    for (int64_t e = 0; e < c.experts; ++e) {
      EXPECT_EQ(h_off[static_cast<size_t>(e)], sum) << "expert " << e;
      sum += count[static_cast<size_t>(e)];
    }
    EXPECT_EQ(h_off[static_cast<size_t>(c.experts)], n);
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = expert_of(ids[static_cast<size_t>(i)]);
      const int32_t r = h_pos[static_cast<size_t>(i)];
      ASSERT_GE(r, h_off[static_cast<size_t>(e)]) << "item " << i;
      ASSERT_LT(r, h_off[static_cast<size_t>(e) + 1]) << "item " << i;
      ++seen[static_cast<size_t>(r)];
      EXPECT_EQ(h_xr[static_cast<size_t>(r)], i / c.k);
      EXPECT_EQ(h_re[static_cast<size_t>(r)], e);
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
  }
}

TEST(GroupItemsByExpertArgs, RejectsBadArguments) {
  int32_t a = 0;
  int32_t* p = &a;
  test::expect_error([&] { group_items_by_expert(p, 8, 0, 4, p, p, p, p, nullptr); }, "sizes");
  test::expect_error([&] { group_items_by_expert(p, 9, 2, 4, p, p, p, p, nullptr); }, "sizes");
  test::expect_error([&] { group_items_by_expert(p, 8, 2, 0, p, p, p, p, nullptr); }, "sizes");
  test::expect_error([&] { group_items_by_expert(p, 8, 2, 5000, p, p, p, p, nullptr); }, "sizes");
  test::expect_error([&] { group_items_by_expert(p, 8, 2, 4, p, p, nullptr, p, nullptr); }, "null");
}

}  // namespace
}  // namespace moe::cuda
