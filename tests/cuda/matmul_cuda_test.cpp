// cuda::matmul (GEMV for 1-8 rows, tiled beyond) for every GPU weight type against
// "dequantize with the CPU reference decoder, then dot in double".
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/matmul.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

// n_out rows of random valid blocks, the bytes (rows padded to row_bytes) and the decoded floats.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [n_out][n_in]
  size_t row_bytes = 0;
};

HostMatrix random_matrix(GgmlType t, int64_t n_in, int64_t n_out, size_t pad, std::mt19937& rng) {
  HostMatrix m;
  m.row_bytes = static_cast<size_t>(*ggml_row_bytes(t, static_cast<uint64_t>(n_in))) + pad;
  m.bytes.assign(m.row_bytes * static_cast<size_t>(n_out), 0xEE);
  m.values.resize(static_cast<size_t>(n_in * n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    const auto row = test::random_row(t, n_in, rng);
    std::copy(row.begin(), row.end(), m.bytes.begin() + static_cast<ptrdiff_t>(o * m.row_bytes));
    cpu::dequantize_row(t, row.data(), m.values.data() + o * n_in, n_in);
  }
  return m;
}

// y[r][o] = sum_i W[o][i] * x[r][i] in double.
std::vector<double> reference(const HostMatrix& m, const std::vector<float>& x, int64_t n_rows,
                              int64_t n_in, int64_t n_out) {
  std::vector<double> y(static_cast<size_t>(n_rows * n_out));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        s += static_cast<double>(m.values[static_cast<size_t>(o * n_in + i)]) *
             x[static_cast<size_t>(r * n_in + i)];
      }
      y[static_cast<size_t>(r * n_out + o)] = s;
    }
  }
  return y;
}

std::vector<int64_t> n_in_cases(GgmlType t) {
  const int64_t block = ggml_type_info_or_throw(t).block_size;
  if (block == 1) return {67, 512};           // float types: rows need not be a multiple of 8
  if (block == 256) return {256, 512, 2304};  // 2304: more units than a warp's lanes
  return {3 * block, 512};
}

std::string type_name(const ::testing::TestParamInfo<GgmlType>& p) {
  return std::string(ggml_type_info_or_throw(p.param).name);
}

class MatmulCudaTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulCudaTest, MatchesDoubleReferenceForGemvAndTiledShapes) {
  MOE_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t n_out = 67;  // odd: partial GEMV blocks and output tiles
  for (const int64_t n_in : n_in_cases(type)) {
    const HostMatrix m = random_matrix(type, n_in, n_out, 0, rng);
    const auto dw = test::to_device(m.bytes);
    const DeviceMatrix w = make_device_matrix(type, dw.get(), n_in, n_out);
    for (const int64_t n_rows : {1, 3, 8, 9, 33, 70}) {
      const auto x = test::random_floats(n_rows * n_in, rng);
      const auto dx = test::to_device(x);
      const auto dy = test::to_device(std::vector<float>(static_cast<size_t>(n_rows * n_out), NAN));
      matmul(w, dx.as<float>(), n_rows, dy.as<float>(), nullptr);
      const auto y = test::to_host<float>(dy, static_cast<size_t>(n_rows * n_out));
      const double err = test::normalized_error(y, reference(m, x, n_rows, n_in, n_out));
      EXPECT_LE(err, test::gpu_product_tolerance(type, n_rows))
          << "n_in " << n_in << " n_rows " << n_rows;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllGpuTypes, MatmulCudaTest, ::testing::ValuesIn(test::computable_types()),
                         type_name);

TEST(MatmulCuda, PaddedRowsAndOwnStream) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const int64_t n_in = 512, n_out = 129;
  // Padding 2 and 4: rows that are not 16-byte (Q4_K: the decode GEMV's 4-byte load path) or
  // 4-byte aligned.
  for (const auto& [type, pad] :
       {std::pair{GgmlType::Q4_K, 64}, std::pair{GgmlType::Q4_K, 4}, std::pair{GgmlType::Q6_K, 2},
        std::pair{GgmlType::Q8_0, 64}, std::pair{GgmlType::F16, 64}, std::pair{GgmlType::F32, 4}}) {
    const HostMatrix m = random_matrix(type, n_in, n_out, static_cast<size_t>(pad), rng);
    const auto dw = test::to_device(m.bytes);
    DeviceMatrix w = make_device_matrix(type, dw.get(), n_in, n_out);
    w.row_bytes = m.row_bytes;  // a view with padded rows
    cudaStream_t stream = nullptr;
    MOE_CUDA_CHECK(cudaStreamCreate(&stream));
    for (const int64_t n_rows : {1, 2, 65}) {
      const auto x = test::random_floats(n_rows * n_in, rng);
      const auto dx = test::to_device(x);
      cuda::DeviceBuffer dy(static_cast<size_t>(n_rows * n_out) * sizeof(float));
      matmul(w, dx.as<float>(), n_rows, dy.as<float>(), stream);
      MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto y = test::to_host<float>(dy, static_cast<size_t>(n_rows * n_out));
      EXPECT_LE(test::normalized_error(y, reference(m, x, n_rows, n_in, n_out)),
                test::gpu_product_tolerance(type, n_rows))
          << ggml_type_label(static_cast<uint32_t>(type)) << " rows " << n_rows;
    }
    MOE_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// Host-side argument checks: they throw before any CUDA call, so they run without a GPU too.
// The staged Q6_K decode GEMV (gemv_q6k.cu) takes products of 2048+ rows: odd row counts, rows
// only 2-byte aligned, activations without float4 alignment, the longest staged row and one
// beyond it (the general GEMV again).
TEST(MatmulCuda, Q6KDecodeGemvOnLargeShapes) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Shape {
    int64_t n_in, n_out;
    size_t pad;
    int64_t x_off;
  };
  for (const Shape& sh : {Shape{2048, 2051, 0, 0}, Shape{768, 2048, 2, 1}, Shape{11264, 2048, 0, 0},
                          Shape{11520, 2048, 0, 0}}) {
    const HostMatrix m = random_matrix(GgmlType::Q6_K, sh.n_in, sh.n_out, sh.pad, rng);
    const auto dw = test::to_device(m.bytes);
    DeviceMatrix w = make_device_matrix(GgmlType::Q6_K, dw.get(), sh.n_in, sh.n_out);
    w.row_bytes = m.row_bytes;
    for (const int64_t n_rows : {1, 2}) {
      const auto x = test::random_floats(n_rows * sh.n_in, rng);
      std::vector<float> xb(static_cast<size_t>(sh.x_off), 0.0f);
      xb.insert(xb.end(), x.begin(), x.end());
      const auto dx = test::to_device(xb);
      const auto dy =
          test::to_device(std::vector<float>(static_cast<size_t>(n_rows * sh.n_out), NAN));
      matmul(w, dx.as<float>() + sh.x_off, n_rows, dy.as<float>(), nullptr);
      const auto y = test::to_host<float>(dy, static_cast<size_t>(n_rows * sh.n_out));
      EXPECT_LE(test::normalized_error(y, reference(m, x, n_rows, sh.n_in, sh.n_out)),
                test::gpu_product_tolerance(GgmlType::Q6_K, n_rows))
          << sh.n_in << " x " << sh.n_out << " pad " << sh.pad << " rows " << n_rows;
    }
  }
}

// 16-bit float weights with many outputs (an output head, gpt-oss's bf16 projections): one
// activation row goes to a warp per output row with 16-byte loads when the rows and activations
// are aligned for them, else to the block-per-row kernel. Both against the reference: rows
// shorter than a warp's loads, an odd tail of loads, rows of a length not a multiple of 8, padded
// rows and unaligned activations.
TEST(MatmulCuda, HalfWeightsOnManyOutputs) {
  MOE_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Shape {
    int64_t n_in, n_out;
    size_t pad;
    int64_t x_off;
  };
  for (const GgmlType type : {GgmlType::F16, GgmlType::BF16}) {
    for (const Shape& sh : {Shape{2880, 1030, 0, 0}, Shape{72, 1024, 0, 0}, Shape{520, 2049, 0, 0},
                            Shape{2884, 1030, 0, 0}, Shape{2880, 1030, 2, 0},
                            Shape{2880, 1030, 0, 1}, Shape{2880, 1023, 0, 0}}) {
      const HostMatrix m = random_matrix(type, sh.n_in, sh.n_out, sh.pad, rng);
      const auto dw = test::to_device(m.bytes);
      DeviceMatrix w = make_device_matrix(type, dw.get(), sh.n_in, sh.n_out);
      w.row_bytes = m.row_bytes;
      for (const int64_t n_rows : {1, 2}) {
        const auto x = test::random_floats(n_rows * sh.n_in, rng);
        std::vector<float> xb(static_cast<size_t>(sh.x_off), 0.0f);
        xb.insert(xb.end(), x.begin(), x.end());
        const auto dx = test::to_device(xb);
        const auto dy =
            test::to_device(std::vector<float>(static_cast<size_t>(n_rows * sh.n_out), NAN));
        matmul(w, dx.as<float>() + sh.x_off, n_rows, dy.as<float>(), nullptr);
        const auto y = test::to_host<float>(dy, static_cast<size_t>(n_rows * sh.n_out));
        EXPECT_LE(test::normalized_error(y, reference(m, x, n_rows, sh.n_in, sh.n_out)),
                  test::gpu_product_tolerance(type, n_rows))
            << ggml_type_label(static_cast<uint32_t>(type)) << " " << sh.n_in << " x " << sh.n_out
            << " pad " << sh.pad << " x_off " << sh.x_off << " rows " << n_rows;
      }
    }
  }
}

TEST(MatmulCuda, RejectsUnsupportedTypesAndBadShapes) {
  const void* fake = reinterpret_cast<const void*>(uintptr_t{0x10000});
  for (const GgmlType t : test::computable_types()) EXPECT_TRUE(cuda_type_supported(t));
  for (const GgmlType t : {GgmlType::IQ2_XXS, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::I32}) {
    EXPECT_FALSE(cuda_type_supported(t));
    test::expect_error([&] { make_device_matrix(t, fake, 256, 1); }, "not supported on the GPU");
  }
  test::expect_error([&] { make_device_matrix(GgmlType::Q4_K, fake, 128, 1); }, "multiple");
  test::expect_error([&] { make_device_matrix(GgmlType::Q8_0, fake, 0, 1); }, "multiple");
  test::expect_error([&] { make_device_matrix(GgmlType::Q8_0, fake, 32, 0); }, "n_out");
  test::expect_error([&] { make_device_matrix(GgmlType::Q8_0, nullptr, 32, 1); }, "null");
  const void* odd = reinterpret_cast<const void*>(uintptr_t{0x10002});
  test::expect_error([&] { make_device_matrix(GgmlType::Q4_K, odd, 256, 1); }, "aligned");
  EXPECT_NO_THROW(make_device_matrix(GgmlType::Q8_0, odd, 32, 1));  // 2-byte blocks

  const DeviceMatrix w = make_device_matrix(GgmlType::Q4_K, fake, 256, 3);
  float* fx = reinterpret_cast<float*>(uintptr_t{0x20000});
  test::expect_error([&] { matmul(w, fx, 0, fx, nullptr); }, "n_rows");
  test::expect_error([&] { matmul(w, nullptr, 1, fx, nullptr); }, "null");
  DeviceMatrix short_rows = w;
  short_rows.row_bytes = 100;
  test::expect_error([&] { matmul(short_rows, fx, 1, fx, nullptr); }, "row_bytes");
}

}  // namespace
}  // namespace moe::cuda
