// matmul (GEMV for 1-8 rows, blocked GEMM beyond) against per-element scalar reference dots.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_dot.h"

namespace moe::cpu {
namespace {

// n_out random rows of `type`, each n_in long, as a matmul weight over its own bytes.
struct RandomWeights {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  RandomWeights(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
    for (int64_t o = 0; o < n_out; ++o) {
      const auto row = test::random_row(type, n_in, rng);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    w = make_weight_matrix(type, bytes.data(), n_in, n_out);
  }
};

// matmul of n_rows fresh random rows on `isa` against vec_dot_ref of each (weight row, quantized
// activation row), within 1e-5 of the sum of |w * a| over the row.
void expect_matmul_matches_ref(const RandomWeights& rw, int64_t n_rows, Isa isa, ThreadPool& pool,
                               MatmulScratch& scratch, std::mt19937& rng) {
  const WeightMatrix& w = rw.w;
  const int64_t n_in = w.n_in, n_out = w.n_out;
  const ActFormat fmt = act_format_for(w.type);
  const auto x = test::random_floats(n_in * n_rows, rng);
  std::vector<float> y(static_cast<size_t>(n_rows * n_out), NAN);
  matmul(w, x.data(), n_rows, y.data(), pool, scratch, isa);
  std::vector<uint8_t> act(act_row_bytes(fmt, n_in));
  std::vector<float> wf(static_cast<size_t>(n_in)), af(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_rows; ++r) {
    quantize_act_row_ref(fmt, x.data() + r * n_in, act.data(), n_in);
    dequantize_act_row(fmt, act.data(), af.data(), n_in);
    for (int64_t o = 0; o < n_out; ++o) {
      const uint8_t* wrow = rw.bytes.data() + o * w.row_bytes;
      float want = 0;
      vec_dot_ref(w.type, n_in, wrow, act.data(), act.size(), 1, &want);
      dequantize_row(w.type, wrow, wf.data(), n_in);
      double mag = 0;
      for (int64_t i = 0; i < n_in; ++i) mag += std::fabs(static_cast<double>(wf[i]) * af[i]);
      const float got = y[static_cast<size_t>(r * n_out + o)];
      EXPECT_LE(std::fabs(static_cast<double>(got) - want), 1e-5 * mag + 1e-30)
          << isa_name(isa) << " rows=" << n_rows << " r=" << r << " o=" << o << " got " << got
          << " want " << want;
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTest, MatchesReferenceForGemvAndGemmShapes) {
  const GgmlType type = GetParam();
  const ActFormat fmt = act_format_for(type);
  const auto info = ggml_type_info_or_throw(type);
  const int64_t n_in = std::max<int64_t>({info.block_size, act_block_size(fmt), 32}) * 3;
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const RandomWeights rw(type, n_in, 13, rng);  // 13 rows: not a multiple of any SIMD or task width
  ThreadPool pool(2);
  MatmulScratch scratch;
  for (int64_t n_rows : {1, 7, 8, 9, 37}) {
    expect_matmul_matches_ref(rw, n_rows, best_isa(), pool, scratch, rng);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest, ::testing::ValuesIn(test::computable_types()),
                         [](const ::testing::TestParamInfo<GgmlType>& p) {
                           return std::string(ggml_type_info_or_throw(p.param).name);
                         });

// MXFP4 (gpt-oss's experts) at its real row length, 2880 (22 groups of 4 blocks and a padded
// last one), on every ISA this CPU runs: the GEMV for 1-8 rows, the GEMM beyond.
TEST(Matmul, Mxfp4AtGptOssShapesOnEveryIsa) {
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const RandomWeights rw(GgmlType::MXFP4, 2880, 13, rng);
  ThreadPool pool(2);
  MatmulScratch scratch;
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    for (int64_t n_rows : {1, 2, 3, 4, 5, 6, 7, 8, 11}) {
      expect_matmul_matches_ref(rw, n_rows, isa, pool, scratch, rng);
    }
  }
}

// Runs `jobs` as one matmul_batch (into ys), then each as its own matmul() (into want), and
// expects the same bits.
void expect_batch_equals_matmuls(const std::vector<MatmulJob>& jobs,
                                 const std::vector<std::vector<float>>& ys,
                                 std::vector<std::vector<float>>& want, ThreadPool& pool,
                                 MatmulScratch& scratch) {
  matmul_batch(jobs, pool, scratch, best_isa());
  for (size_t j = 0; j < jobs.size(); ++j) {
    matmul(jobs[j].w, jobs[j].x, jobs[j].n_rows, want[j].data(), pool, scratch, best_isa());
    for (size_t i = 0; i < want[j].size(); ++i) {
      ASSERT_EQ(ys[j][i], want[j][i]) << "job " << j << " element " << i;
    }
  }
}

// matmul_batch: many small products of mixed types in one dispatch, each bit-identical to
// matmul() on its own (the CPU expert executor relies on that for decode and prefill), also when
// jobs are too large for a GEMV.
TEST(MatmulBatch, EqualsOneMatmulPerJob) {
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16};
  std::vector<std::vector<uint8_t>> weights;
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<float>> ys, want;
  std::vector<MatmulJob> jobs;
  const int64_t n_in = 512;
  for (int j = 0; j < 9; ++j) {
    const GgmlType type = types[j % 4];
    const int64_t n_out = 37 + 61 * j;  // odd, and some large enough to split into tasks
    const int64_t rows = 1 + j % 8;
    std::vector<uint8_t> wb;
    for (int64_t o = 0; o < n_out; ++o) {
      const auto row = test::random_row(type, n_in, rng);
      wb.insert(wb.end(), row.begin(), row.end());
    }
    weights.push_back(std::move(wb));
    xs.push_back(test::random_floats(n_in * rows, rng));
    ys.emplace_back(static_cast<size_t>(rows * n_out), NAN);
    want.emplace_back(static_cast<size_t>(rows * n_out), NAN);
    jobs.push_back({make_weight_matrix(type, weights.back().data(), n_in, n_out), xs.back().data(),
                    rows, ys.back().data()});
  }
  ThreadPool pool(2);
  MatmulScratch scratch;
  expect_batch_equals_matmuls(jobs, ys, want, pool, scratch);
  // GEMM jobs (more rows than a GEMV takes, a prefill's experts) go out in the same dispatch as
  // GEMV jobs, over every job's weight blocks; two of them share one converted input, and the odd
  // row counts leave partial chunks of activation rows.
  std::vector<float> x11 = test::random_floats(n_in * 11, rng);
  std::vector<float> x33 = test::random_floats(n_in * 33, rng);
  std::vector<std::vector<float>> ym, wm;
  const std::pair<size_t, const std::vector<float>*> gemms[] = {
      {0, &x11}, {2, &x33}, {3, &x33}, {5, &x11}};
  std::vector<MatmulJob> mixed = {jobs[1]};
  ym.push_back(std::vector<float>(ys[1].size(), NAN));
  wm.push_back(std::vector<float>(ys[1].size(), NAN));
  for (const auto& [j, x] : gemms) {
    const int64_t rows = static_cast<int64_t>(x->size()) / n_in;
    ym.emplace_back(static_cast<size_t>(rows * jobs[j].w.n_out), NAN);
    wm.emplace_back(ym.back().size(), NAN);
    mixed.push_back({jobs[j].w, x->data(), rows, nullptr});
  }
  for (size_t i = 0; i < mixed.size(); ++i) mixed[i].y = ym[i].data();
  expect_batch_equals_matmuls(mixed, ym, wm, pool, scratch);
  MatmulJob none = jobs[0];
  none.n_rows = 0;
  EXPECT_THROW(matmul_batch(std::span<const MatmulJob>(&none, 1), pool, scratch, best_isa()),
               Error);
}

// Jobs that read the same activations (an expert's gate and up, all experts of a decode token)
// share one converted copy per activation format; the results stay those of separate matmuls,
// including for a job that reads only the first of the shared rows.
TEST(MatmulBatch, SharedInputsEqualOneMatmulPerJob) {
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const int64_t n_in = 768, rows = 3;
  const std::vector<float> x = test::random_floats(n_in * rows, rng);
  const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0,
                            GgmlType::F16,  GgmlType::Q4_K, GgmlType::Q5_0};
  std::vector<std::vector<uint8_t>> weights;
  std::vector<std::vector<float>> ys, want;
  std::vector<MatmulJob> jobs;
  for (size_t j = 0; j < std::size(types) + 1; ++j) {
    const GgmlType type = types[j % std::size(types)];
    const int64_t n_out = 29 + 53 * static_cast<int64_t>(j);
    const int64_t n_rows = j < std::size(types) ? rows : 1;
    std::vector<uint8_t> wb;
    for (int64_t o = 0; o < n_out; ++o) {
      const auto row = test::random_row(type, n_in, rng);
      wb.insert(wb.end(), row.begin(), row.end());
    }
    weights.push_back(std::move(wb));
    ys.emplace_back(static_cast<size_t>(n_rows * n_out), NAN);
    want.emplace_back(static_cast<size_t>(n_rows * n_out), NAN);
    jobs.push_back({make_weight_matrix(type, weights.back().data(), n_in, n_out), x.data(), n_rows,
                    ys.back().data()});
  }
  ThreadPool pool(3);
  MatmulScratch scratch;
  expect_batch_equals_matmuls(jobs, ys, want, pool, scratch);
}

TEST(Matmul, RejectsUnsupportedTypesAndShapes) {
  uint8_t dummy[256] = {};
  EXPECT_THROW(make_weight_matrix(GgmlType::IQ2_XXS, dummy, 256, 1), Error);
  EXPECT_THROW(make_weight_matrix(GgmlType::Q4_K, dummy, 128, 1), Error);  // not a 256-multiple
  EXPECT_THROW(make_weight_matrix(GgmlType::Q8_0, dummy, 0, 1), Error);
  EXPECT_THROW(make_weight_matrix(GgmlType::Q8_0, dummy, 32, -1), Error);
}

}  // namespace
}  // namespace moe::cpu
