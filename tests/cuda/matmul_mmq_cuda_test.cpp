// The int8 tensor-core product (matmul_mmq.cuh) for every block type against a scalar reference
// that rounds the activations as the kernel states it does (per 32 values: d = max|x| / 127,
// q = round(x * (127 / max|x|))) and then dots the CPU-decoded weights with d * q in double. So a
// misplaced code, scale or fragment shows as an O(1) error, not hidden in the rounding's 0.5%.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/dequant.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/matmul.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

// x (n_rows rows of n_in) with each 32 values rounded to int8 codes and back, as the kernel does.
std::vector<double> quantized_activations(const std::vector<float>& x, int64_t n_in) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = x.data() + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const float d = amax / 127.0f;
    for (int i = 0; i < 32; ++i) {
      out[32 * b + static_cast<size_t>(i)] =
          static_cast<double>(d) * static_cast<double>(std::nearbyint(v[i] * inv));
    }
  }
  (void)n_in;  // rows are whole blocks: n_in is a multiple of 32
  return out;
}

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [n_out][n_in], decoded by the CPU
};

Weights random_weights(GgmlType t, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  Weights w;
  for (int64_t o = 0; o < n_out; ++o) {
    const auto row = test::random_row(t, n_in, rng);
    w.bytes.insert(w.bytes.end(), row.begin(), row.end());
    w.values.resize(static_cast<size_t>((o + 1) * n_in));
    cpu::dequantize_row(t, row.data(), w.values.data() + o * n_in, n_in);
  }
  return w;
}

// y[r][o] = sum_i W[o][i] * xq[x_row(r)][i] in double.
std::vector<double> reference(const Weights& w, const std::vector<double>& xq,
                              const std::vector<int32_t>& x_rows, int64_t n_in, int64_t n_out) {
  std::vector<double> y(x_rows.size() * static_cast<size_t>(n_out));
  for (size_t r = 0; r < x_rows.size(); ++r) {
    const double* xr = xq.data() + static_cast<size_t>(x_rows[r]) * static_cast<size_t>(n_in);
    for (int64_t o = 0; o < n_out; ++o) {
      const float* wr = w.values.data() + o * n_in;
      double s = 0;
      for (int64_t i = 0; i < n_in; ++i) s += static_cast<double>(wr[i]) * xr[i];
      y[r * static_cast<size_t>(n_out) + static_cast<size_t>(o)] = s;
    }
  }
  return y;
}

// Random activations with an all-zero row (no scale to divide by) and a row 1e4 times larger.
std::vector<float> activations(int64_t n_rows, int64_t n_in, std::mt19937& rng) {
  std::vector<float> x = test::random_floats(n_rows * n_in, rng);
  std::fill(x.begin(), x.begin() + n_in, 0.0f);
  if (n_rows > 2) {
    for (int64_t i = 0; i < n_in; ++i) x[static_cast<size_t>(2 * n_in + i)] *= 1e4f;
  }
  return x;
}

std::vector<int64_t> n_in_cases(GgmlType t) {
  const int64_t block = ggml_type_info_or_throw(t).block_size;
  if (block == 256) return {256, 2304};  // 2304: 36 stages of 64
  return {3 * block, 512};               // 3 * 32 = 96: a stage of 64 and a half one
}

std::string type_name(const ::testing::TestParamInfo<GgmlType>& p) {
  return std::string(ggml_type_info_or_throw(p.param).name);
}

std::vector<GgmlType> block_types() {
  std::vector<GgmlType> out;
  for (const GgmlType t : test::computable_types()) {
    if (ggml_type_info_or_throw(t).block_size > 1) out.push_back(t);
  }
  return out;
}

// The int8 product is opt-in (MOE_CUDA_MMQ=1): these tests turn it on for their own launches.
struct Int8On {
  Int8On() { set_int8_products(true); }
  ~Int8On() { set_int8_products(std::nullopt); }
  Int8On(const Int8On&) = delete;
  Int8On& operator=(const Int8On&) = delete;
};

class MmqCudaTest : public ::testing::TestWithParam<GgmlType> {};

// matmul() of 9..130 rows: every edge of the 128-output, 64-row and 64-K tiles.
TEST_P(MmqCudaTest, MatchesQuantizedActivationReference) {
  MOE_REQUIRE_GPU();
  const Int8On int8;
  ASSERT_TRUE(int8_products_enabled()) << "every architecture we build runs the int8 product";
  const GgmlType type = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const int64_t n_in : n_in_cases(type)) {
    for (const int64_t n_out : {67, 200}) {
      const Weights w = random_weights(type, n_in, n_out, rng);
      const auto dw = test::to_device(w.bytes);
      const DeviceMatrix m = make_device_matrix(type, dw.get(), n_in, n_out);
      for (const int64_t n_rows : {9, 33, 64, 65, 130}) {
        const std::vector<float> x = activations(n_rows, n_in, rng);
        const auto dx = test::to_device(x);
        const auto dy =
            test::to_device(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
        matmul(m, dx.as<float>(), n_rows, dy.as<float>(), nullptr);
        const auto y = test::to_host<float>(dy, static_cast<size_t>(n_rows * n_out));
        std::vector<int32_t> rows(static_cast<size_t>(n_rows));
        for (int64_t r = 0; r < n_rows; ++r) rows[static_cast<size_t>(r)] = static_cast<int32_t>(r);
        const std::vector<double> want =
            reference(w, quantized_activations(x, n_in), rows, n_in, n_out);
        EXPECT_LE(test::normalized_error(y, want), 1e-4)
            << "n_in " << n_in << " n_out " << n_out << " rows " << n_rows;
        for (int64_t o = 0; o < n_out; ++o) EXPECT_EQ(y[static_cast<size_t>(o)], 0.0f);  // zero row
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockTypes, MmqCudaTest, ::testing::ValuesIn(block_types()), type_name);

// grouped_matmul(): groups of 0, 9, 70, 3 and 12 rows, activation rows gathered through x_rows,
// and a group without weights (NaN rows, nothing read).
TEST(MmqCuda, GroupedRowsGatheredAndMissingExpert) {
  MOE_REQUIRE_GPU();
  const Int8On int8;
  ASSERT_TRUE(int8_products_enabled()) << "every architecture we build runs the int8 product";
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const int64_t n_in = 512, n_out = 150, n_x = 40;
    const std::vector<int32_t> sizes{0, 9, 70, 3, 12};
    const int missing = 4;  // the last group has no weights
    std::vector<Weights> ws;
    std::vector<DeviceBuffer> dws;
    std::vector<const void*> ptrs;
    std::vector<int32_t> offsets{0};
    std::vector<int32_t> x_rows;
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_x - 1));
    for (size_t g = 0; g < sizes.size(); ++g) {
      ws.push_back(random_weights(type, n_in, n_out, rng));
      dws.push_back(test::to_device(ws.back().bytes));
      ptrs.push_back(static_cast<int>(g) == missing ? nullptr : dws.back().get());
      offsets.push_back(offsets.back() + sizes[g]);
      for (int32_t r = 0; r < sizes[g]; ++r) x_rows.push_back(pick(rng));
    }
    const std::vector<float> x = activations(n_x, n_in, rng);
    const auto dx = test::to_device(x);
    const auto dptrs = test::to_device(ptrs);
    const auto doff = test::to_device(offsets);
    const auto drows = test::to_device(x_rows);
    const auto total = static_cast<size_t>(offsets.back());
    const auto dy = test::to_device(std::vector<float>(total * static_cast<size_t>(n_out), 0.0f));
    grouped_matmul(type, n_in, n_out, ws[0].bytes.size() / static_cast<size_t>(n_out),
                   reinterpret_cast<const void* const*>(dptrs.get()), doff.as<int32_t>(),
                   static_cast<int32_t>(sizes.size()), drows.as<int32_t>(),
                   static_cast<int64_t>(total), 70, dx.as<float>(), n_in, dy.as<float>(), nullptr);
    const auto y = test::to_host<float>(dy, total * static_cast<size_t>(n_out));
    const std::vector<double> xq = quantized_activations(x, n_in);
    for (size_t g = 0; g < sizes.size(); ++g) {
      const auto r0 = static_cast<size_t>(offsets[g]), n = static_cast<size_t>(sizes[g]);
      const std::vector<float> got(y.begin() + static_cast<ptrdiff_t>(r0 * n_out),
                                   y.begin() + static_cast<ptrdiff_t>((r0 + n) * n_out));
      if (static_cast<int>(g) == missing) {
        for (const float v : got) EXPECT_TRUE(std::isnan(v));
        continue;
      }
      if (n == 0) continue;
      const std::vector<int32_t> rows(x_rows.begin() + static_cast<ptrdiff_t>(r0),
                                      x_rows.begin() + static_cast<ptrdiff_t>(r0 + n));
      // max_rows_per_group 70: every group, the 3-row one too, runs the int8 kernel.
      EXPECT_LE(test::normalized_error(got, reference(ws[g], xq, rows, n_in, n_out)), 1e-4)
          << ggml_type_label(static_cast<uint32_t>(type)) << " group " << g;
    }
  }
}

}  // namespace
}  // namespace moe::cuda
