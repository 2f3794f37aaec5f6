// cuda::grouped_matmul: groups of unequal sizes (empty ones too), permuted activation rows,
// strided activations, GEMV and tiled paths, against a double reference per group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_matmul.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

struct Case {
  std::vector<int32_t> sizes;  // rows per group
  int64_t bound_extra;         // added to the true max rows per group when passed as the bound
};

class GroupedMatmulCudaTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GroupedMatmulCudaTest, MatchesPerGroupReference) {
  MOE_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t block = ggml_type_info_or_throw(type).block_size;
  const int64_t n_in = block == 1 ? 67 : 512;
  const int64_t n_out = 67;
  const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(type, static_cast<uint64_t>(n_in)));
  const size_t mat_bytes = row_bytes * static_cast<size_t>(n_out);
  const std::vector<Case> cases = {
      {{3, 0, 1, 12, 0, 5}, 0},       // tiled, with empty groups
      {{1, 0, 2, 1, 0}, 0},           // GEMV
      {{1, 1, 1, 1, 1, 1, 1, 1}, 0},  // decode: one row per expert
      {{70, 0, 2}, 0},                // tiled, two row tiles in one group
      {{33, 31, 40, 29, 64}, 0},      // a prefill's experts: about 32 rows each
      {{100, 45}, 0},                 // large groups: several row tiles
      {{4, 9, 1}, 50},                // a loose bound
      {{12, 3}, -11},                 // a bound below the truth still computes every row
  };
  for (const Case& c : cases) {
    const auto n_groups = static_cast<int32_t>(c.sizes.size());
    std::vector<int32_t> offsets(c.sizes.size() + 1, 0);
    std::partial_sum(c.sizes.begin(), c.sizes.end(), offsets.begin() + 1);
    const int64_t total = offsets.back();
    const int64_t max_rows = *std::max_element(c.sizes.begin(), c.sizes.end()) + c.bound_extra;
    // One weight matrix per group in one buffer.
    std::vector<uint8_t> wbytes;
    std::vector<float> wvals(static_cast<size_t>(n_groups * n_out * n_in));
    for (int32_t g = 0; g < n_groups; ++g) {
      for (int64_t o = 0; o < n_out; ++o) {
        const auto row = test::random_row(type, n_in, rng);
        wbytes.insert(wbytes.end(), row.begin(), row.end());
        cpu::dequantize_row(type, row.data(), wvals.data() + (g * n_out + o) * n_in, n_in);
      }
    }
    const auto dw = test::to_device(wbytes);
    std::vector<const void*> ptrs;
    for (int32_t g = 0; g < n_groups; ++g) ptrs.push_back(dw.as<uint8_t>() + g * mat_bytes);
    const auto dptrs = test::to_device(ptrs);
    const auto doff = test::to_device(offsets);
    // Output row j reads x row perm[j]; x rows are strided (with and without float4 alignment).
    std::vector<int32_t> x_rows(static_cast<size_t>(total));
    std::iota(x_rows.begin(), x_rows.end(), 0);
    std::shuffle(x_rows.begin(), x_rows.end(), rng);
    const auto drows = test::to_device(x_rows);
    for (const int64_t x_stride : {n_in, n_in + 3, n_in + 4}) {
      const auto x = test::random_floats(total * x_stride, rng);
      const auto dx = test::to_device(x);
      const auto dy = test::to_device(std::vector<float>(static_cast<size_t>(total * n_out), NAN));
      grouped_matmul(type, n_in, n_out, row_bytes, dptrs.as<const void*>(), doff.as<int32_t>(),
                     n_groups, drows.as<int32_t>(), total, std::max<int64_t>(max_rows, 1),
                     dx.as<float>(), x_stride, dy.as<float>(), nullptr);
      const auto y = test::to_host<float>(dy, static_cast<size_t>(total * n_out));
      std::vector<double> want(static_cast<size_t>(total * n_out));
      for (int32_t g = 0; g < n_groups; ++g) {
        for (int32_t j = offsets[static_cast<size_t>(g)]; j < offsets[static_cast<size_t>(g) + 1];
             ++j) {
          const float* xr = x.data() + x_rows[static_cast<size_t>(j)] * x_stride;
          for (int64_t o = 0; o < n_out; ++o) {
            const float* wr = wvals.data() + (g * n_out + o) * n_in;
            double s = 0;
            for (int64_t i = 0; i < n_in; ++i) s += static_cast<double>(wr[i]) * xr[i];
            want[static_cast<size_t>(j * n_out + o)] = s;
          }
        }
      }
      std::string sizes;
      for (const int32_t s : c.sizes) sizes += std::to_string(s) + " ";
      EXPECT_LE(test::normalized_error(y, want),
                test::gpu_product_tolerance(type, std::max<int64_t>(max_rows, 1)))
          << "groups [ " << sizes << "] bound " << max_rows << " x_stride " << x_stride;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllGpuTypes, GroupedMatmulCudaTest,
                         ::testing::ValuesIn(test::computable_types()),
                         [](const ::testing::TestParamInfo<GgmlType>& p) {
                           return std::string(ggml_type_info_or_throw(p.param).name);
                         });

TEST(GroupedMatmulCuda, NullGroupPointerGivesNanRowsAndLeavesOthersCorrect) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const GgmlType type = GgmlType::Q8_0;
  const int64_t n_in = 64, n_out = 70;
  const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(type, n_in));
  std::vector<uint8_t> wbytes;
  std::vector<float> wvals(static_cast<size_t>(n_out * n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    const auto row = test::random_row(type, n_in, rng);
    wbytes.insert(wbytes.end(), row.begin(), row.end());
    cpu::dequantize_row(type, row.data(), wvals.data() + o * n_in, n_in);
  }
  const auto dw = test::to_device(wbytes);
  const std::vector<const void*> ptrs = {dw.get(), nullptr, dw.get()};
  const std::vector<int32_t> offsets = {0, 2, 5, 6}, x_rows = {5, 4, 3, 2, 1, 0};
  const auto dptrs = test::to_device(ptrs), doff = test::to_device(offsets),
             drows = test::to_device(x_rows);
  const auto x = test::random_floats(6 * n_in, rng);
  const auto dx = test::to_device(x);
  for (const int64_t bound : {3, 9}) {  // GEMV and tiled
    cuda::DeviceBuffer dy(6 * n_out * sizeof(float));
    grouped_matmul(type, n_in, n_out, row_bytes, dptrs.as<const void*>(), doff.as<int32_t>(), 3,
                   drows.as<int32_t>(), 6, bound, dx.as<float>(), n_in, dy.as<float>(), nullptr);
    const auto y = test::to_host<float>(dy, 6 * n_out);
    for (int64_t j = 0; j < 6; ++j) {
      for (int64_t o = 0; o < n_out; ++o) {
        const float got = y[static_cast<size_t>(j * n_out + o)];
        if (j >= 2 && j < 5) {
          EXPECT_TRUE(std::isnan(got)) << "bound " << bound << " row " << j;
          continue;
        }
        double want = 0, size = 0;
        for (int64_t i = 0; i < n_in; ++i) {
          const double p = static_cast<double>(wvals[static_cast<size_t>(o * n_in + i)]) *
                           x[static_cast<size_t>(x_rows[static_cast<size_t>(j)] * n_in + i)];
          want += p;
          size += std::fabs(p);
        }
        // Tiled (tensor cores): each product's operands rounded to FP16, 2^-11 relative at most.
        const double tol = bound > 8 ? 1e-4 + 1e-3 * size : 1e-4;
        EXPECT_NEAR(got, want, tol) << "bound " << bound << " row " << j << " out " << o;
      }
    }
  }
}

// Decode items of Q6_K experts (ffn_down of the Q4_K_M mixes: 8 groups of 2048 rows, above the
// staged GEMV's threshold) against a double reference; a null group gives NaN rows only.
TEST(GroupedMatmulCuda, Q6KDecodeItemsOnTheStagedGemv) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const GgmlType type = GgmlType::Q6_K;
  const int64_t n_in = 768, n_out = 2048, n_groups = 8;
  const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(type, n_in));
  std::vector<uint8_t> wbytes;
  std::vector<float> wvals(static_cast<size_t>(n_groups * n_out * n_in));
  for (int64_t r = 0; r < n_groups * n_out; ++r) {
    const auto row = test::random_row(type, n_in, rng);
    wbytes.insert(wbytes.end(), row.begin(), row.end());
    cpu::dequantize_row(type, row.data(), wvals.data() + r * n_in, n_in);
  }
  const auto dw = test::to_device(wbytes);
  std::vector<const void*> ptrs;
  for (int64_t g = 0; g < n_groups; ++g) {
    ptrs.push_back(g == 5 ? nullptr : dw.as<uint8_t>() + g * n_out * row_bytes);
  }
  std::vector<int32_t> offsets(static_cast<size_t>(n_groups + 1));
  std::iota(offsets.begin(), offsets.end(), 0);
  const auto dptrs = test::to_device(ptrs), doff = test::to_device(offsets);
  const auto x = test::random_floats(n_groups * n_in, rng);
  const auto dx = test::to_device(x);
  cuda::DeviceBuffer dy(static_cast<size_t>(n_groups * n_out) * sizeof(float));
  grouped_matmul(type, n_in, n_out, row_bytes, dptrs.as<const void*>(), doff.as<int32_t>(),
                 static_cast<int32_t>(n_groups), doff.as<int32_t>(), n_groups, 1, dx.as<float>(),
                 n_in, dy.as<float>(), nullptr);
  const auto y = test::to_host<float>(dy, static_cast<size_t>(n_groups * n_out));
  for (int64_t g = 0; g < n_groups; ++g) {
    const std::vector<float> got(y.begin() + g * n_out, y.begin() + (g + 1) * n_out);
    if (g == 5) {
      for (const float v : got) ASSERT_TRUE(std::isnan(v)) << "group " << g;
      continue;
    }
    std::vector<double> want(static_cast<size_t>(n_out));
    for (int64_t o = 0; o < n_out; ++o) {
      const float* wr = wvals.data() + (g * n_out + o) * n_in;
      double s = 0;
      for (int64_t i = 0; i < n_in; ++i) s += static_cast<double>(wr[i]) * x[g * n_in + i];
      want[static_cast<size_t>(o)] = s;
    }
    EXPECT_LE(test::normalized_error(got, want), test::gpu_product_tolerance(type, 1))
        << "group " << g;
  }
}

// The fused decode gate/up/SwiGLU against a double reference, and against the separate products
// plus swiglu() on the GPU; a null up pointer gives NaN rows for its item only.
TEST(GroupedMatmulCuda, FusedGateUpSwigluMatchesSeparateProducts) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const GgmlType type = GgmlType::Q4_K;
  const int64_t n_out = 67;  // odd: a block's last warps idle
  const int32_t n_items = 6, null_item = 4;
  for (const int64_t n_in : {512, 2304}) {  // 2304: more 64-weight halves than a warp's lanes
    SCOPED_TRACE("n_in " + std::to_string(n_in));
    ASSERT_TRUE(fused_gate_up_supported(type, type, n_in));
    const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(type, n_in));
    // Matrices 0 .. 2 * n_items - 1: item i's gate is 2i, its up 2i + 1.
    std::vector<uint8_t> wbytes;
    std::vector<float> wvals(static_cast<size_t>(2 * n_items * n_out * n_in));
    for (int64_t r = 0; r < 2 * n_items * n_out; ++r) {
      const auto row = test::random_row(type, n_in, rng);
      wbytes.insert(wbytes.end(), row.begin(), row.end());
      cpu::dequantize_row(type, row.data(), wvals.data() + r * n_in, n_in);
    }
    const auto dw = test::to_device(wbytes);
    const size_t mat_bytes = row_bytes * static_cast<size_t>(n_out);
    std::vector<const void*> gate, up;
    for (int32_t i = 0; i < n_items; ++i) {
      gate.push_back(dw.as<uint8_t>() + (2 * i) * mat_bytes);
      up.push_back(i == null_item ? nullptr : dw.as<uint8_t>() + (2 * i + 1) * mat_bytes);
    }
    std::vector<int32_t> offsets(n_items + 1), x_rows(n_items);
    std::iota(offsets.begin(), offsets.end(), 0);
    std::iota(x_rows.begin(), x_rows.end(), 0);
    std::shuffle(x_rows.begin(), x_rows.end(), rng);
    const auto x = test::random_floats(n_items * n_in, rng);
    const auto dgate = test::to_device(gate), dup = test::to_device(up);
    const auto doff = test::to_device(offsets), drows = test::to_device(x_rows);
    const auto dx = test::to_device(x);
    const auto n_h = static_cast<size_t>(n_items * n_out);
    cuda::DeviceBuffer dh(n_h * sizeof(float)), dg(n_h * sizeof(float)), du(n_h * sizeof(float)),
        dsep(n_h * sizeof(float));
    grouped_gate_up_swiglu(type, n_in, n_out, row_bytes, dgate.as<const void*>(),
                           dup.as<const void*>(), doff.as<int32_t>(), n_items, drows.as<int32_t>(),
                           dx.as<float>(), n_in, dh.as<float>(), nullptr);
    const auto h = test::to_host<float>(dh, n_h);

    std::vector<float> got;
    std::vector<double> want;
    for (int32_t i = 0; i < n_items; ++i) {
      const float* xr = x.data() + x_rows[static_cast<size_t>(i)] * n_in;
      for (int64_t o = 0; o < n_out; ++o) {
        const float hv = h[static_cast<size_t>(i * n_out + o)];
        if (i == null_item) {
          EXPECT_TRUE(std::isnan(hv)) << "item " << i << " out " << o;
          continue;
        }
        double g = 0, u = 0;
        const float* gr = wvals.data() + ((2 * i) * n_out + o) * n_in;
        const float* ur = wvals.data() + ((2 * i + 1) * n_out + o) * n_in;
        for (int64_t k = 0; k < n_in; ++k) {
          g += static_cast<double>(gr[k]) * xr[k];
          u += static_cast<double>(ur[k]) * xr[k];
        }
        got.push_back(hv);
        want.push_back(g / (1.0 + std::exp(-g)) * u);
      }
    }
    EXPECT_LE(test::normalized_error(got, want), 1e-5);

    // The separate path (Q4_K decode GEMVs, then swiglu) on the items that have both matrices.
    std::vector<const void*> up_ok = up;
    up_ok[null_item] = gate[null_item];
    const auto dup_ok = test::to_device(up_ok);
    grouped_matmul(type, n_in, n_out, row_bytes, dgate.as<const void*>(), doff.as<int32_t>(),
                   n_items, drows.as<int32_t>(), n_items, 1, dx.as<float>(), n_in, dg.as<float>(),
                   nullptr);
    grouped_matmul(type, n_in, n_out, row_bytes, dup_ok.as<const void*>(), doff.as<int32_t>(),
                   n_items, drows.as<int32_t>(), n_items, 1, dx.as<float>(), n_in, du.as<float>(),
                   nullptr);
    swiglu(dg.as<float>(), du.as<float>(), dsep.as<float>(), n_items * n_out, nullptr);
    const auto sep = test::to_host<float>(dsep, n_h);
    double max_diff = 0, max_abs = 0;
    for (size_t k = 0; k < n_h; ++k) {
      if (static_cast<int64_t>(k) / n_out == null_item) continue;
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(sep[k] - h[k])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(sep[k])));
    }
    EXPECT_LE(max_diff, 1e-6 * max_abs);
  }
}

// Host-side argument checks (no GPU needed: they throw before any CUDA call).
TEST(GroupedMatmulCuda, RejectsBadArguments) {
  const auto* ptrs = reinterpret_cast<const void* const*>(uintptr_t{0x10000});
  const auto* ip = reinterpret_cast<const int32_t*>(uintptr_t{0x20000});
  const auto* fx = reinterpret_cast<const float*>(uintptr_t{0x30000});
  auto* fy = reinterpret_cast<float*>(uintptr_t{0x40000});
  const size_t rb = 144;  // one Q4_K block
  const auto call = [&](GgmlType t, int64_t n_in, size_t row_bytes, int32_t n_groups,
                        const int32_t* off, int64_t total, int64_t max_rows, int64_t stride) {
    grouped_matmul(t, n_in, 5, row_bytes, ptrs, off, n_groups, ip, total, max_rows, fx, stride, fy,
                   nullptr);
  };
  test::expect_error([&] { call(GgmlType::IQ2_XXS, 256, 66, 1, ip, 1, 1, 256); }, "not supported");
  test::expect_error([&] { call(GgmlType::Q4_K, 128, rb, 1, ip, 1, 1, 256); }, "multiple");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, 100, 1, ip, 1, 1, 256); }, "row_bytes");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, -1, ip, 1, 1, 256); }, "n_groups");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 70000, ip, 1, 1, 256); }, "n_groups");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 2, nullptr, 4, 2, 256); }, "null");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 2, ip, 4, 2, 255); }, "x_stride");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 2, ip, 4, 0, 256); }, "max_rows");
  // Nothing to do: no launch, no error.
  EXPECT_NO_THROW(call(GgmlType::Q4_K, 256, rb, 0, ip, 0, 0, 256));
  EXPECT_NO_THROW(call(GgmlType::Q4_K, 256, rb, 3, ip, 0, 0, 256));
}

// The fused gate/up/SwiGLU's host-side checks (no launch, so no GPU needed).
TEST(GroupedMatmulCuda, RejectsBadFusedGateUpArguments) {
  const auto* ptrs = reinterpret_cast<const void* const*>(uintptr_t{0x10000});
  const auto* ip = reinterpret_cast<const int32_t*>(uintptr_t{0x20000});
  auto* f = reinterpret_cast<float*>(uintptr_t{0x30000});
  const size_t rb = 144;
  EXPECT_FALSE(fused_gate_up_supported(GgmlType::Q8_0, GgmlType::Q8_0, 256));
  EXPECT_FALSE(fused_gate_up_supported(GgmlType::Q4_K, GgmlType::Q6_K, 256));
  EXPECT_FALSE(fused_gate_up_supported(GgmlType::Q4_K, GgmlType::Q4_K, 12544));
  const auto call = [&](GgmlType t, int64_t n_in, size_t row_bytes, int32_t n_items,
                        const void* const* up, int64_t stride) {
    grouped_gate_up_swiglu(t, n_in, 8, row_bytes, ptrs, up, ip, n_items, ip, f, stride, f, nullptr);
  };
  test::expect_error([&] { call(GgmlType::Q8_0, 256, 272, 1, ptrs, 256); }, "not supported");
  test::expect_error([&] { call(GgmlType::Q4_K, 12544, 49 * 144, 1, ptrs, 12544); },
                     "not supported");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, 100, 1, ptrs, 256); }, "row_bytes");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 70000, ptrs, 256); }, "n_items");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 2, nullptr, 256); }, "null");
  test::expect_error([&] { call(GgmlType::Q4_K, 256, rb, 2, ptrs, 255); }, "x_stride");
  EXPECT_NO_THROW(call(GgmlType::Q4_K, 256, rb, 0, ptrs, 256));  // nothing to do
}

}  // namespace
}  // namespace moe::cuda
