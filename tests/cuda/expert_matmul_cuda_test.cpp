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
#include "kernels/cuda/expert_matmul.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/random_blocks.h"

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

}  // namespace
}  // namespace moe::cuda
