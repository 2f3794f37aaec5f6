// Every SIMD vec_dot kernel against the scalar reference on fresh random data, for every
// computable type, every ISA this CPU runs, 1..8 activation rows and several row lengths.
#include "kernels/cpu/vec_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/random_blocks.h"

namespace moe::cpu {
namespace {

struct Case {
  GgmlType type;
  Isa isa;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (GgmlType t : test::computable_types()) {
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      // An ISA this CPU cannot execute is not a case here; scripts/gpu-check runs this same
      // binary on the AVX-512 device machine.
      if (isa_supported(isa)) out.push_back({t, isa});
    }
  }
  return out;
}

class VecDotTest : public ::testing::TestWithParam<Case> {};

TEST_P(VecDotTest, MatchesScalarReference) {
  const auto [type, isa] = GetParam();
  const VecDotFn kernel = vec_dot_kernel(type, isa);
  ASSERT_NE(kernel, nullptr);
  const ActFormat fmt = act_format_for(type);
  const auto info = ggml_type_info_or_throw(type);
  // Row lengths: one block, a few blocks, and long odd multiples (not a multiple of any SIMD
  // unrolling factor).
  const int64_t unit = std::max<int64_t>({info.block_size, act_block_size(fmt), 32});
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  for (int64_t blocks : {1, 3, 7, 33}) {
    const int64_t n = unit * blocks;
    const auto w = test::random_row(type, n, rng);
    // Activation rows are padded apart so a kernel that ignores act_stride fails.
    const size_t stride = act_row_bytes(fmt, n) + 64;
    std::vector<uint8_t> act(stride * kMaxActRows);
    std::vector<float> deq(static_cast<size_t>(n));
    std::vector<float> wdeq(static_cast<size_t>(n));
    dequantize_row(type, w.data(), wdeq.data(), n);
    for (int r = 0; r < kMaxActRows; ++r) {
      const auto x = test::random_floats(n, rng);
      quantize_act_row_ref(fmt, x.data(), act.data() + r * stride, n);
    }
    for (int n_act = 1; n_act <= kMaxActRows; ++n_act) {
      float got[kMaxActRows];
      float want[kMaxActRows];
      kernel(n, w.data(), act.data(), stride, n_act, got);
      vec_dot_ref(type, n, w.data(), act.data(), stride, n_act, want);
      for (int r = 0; r < n_act; ++r) {
        // Normalise by sum |w_i a_i| so the bound is independent of cancellation.
        dequantize_act_row(fmt, act.data() + r * stride, deq.data(), n);
        double mag = 0;
        for (int64_t i = 0; i < n; ++i) mag += std::fabs(static_cast<double>(wdeq[i]) * deq[i]);
        ASSERT_GT(mag, 0.0);
        const double err = std::fabs(static_cast<double>(got[r]) - want[r]) / mag;
        EXPECT_LE(err, 1e-5) << "n=" << n << " n_act=" << n_act << " row " << r << " got " << got[r]
                             << " want " << want[r];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, VecDotTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string name(ggml_type_info_or_throw(p.param.type).name);
                           return name + "_" + std::string(isa_name(p.param.isa));
                         });

// MXFP4's kernels (dot_mxfp4.inc) go through groups of 4 blocks, two groups at a time, then one
// group, then a zero-padded last group: every block count up to 3 pairs of groups and some long
// odd ones, every row count, each AVX-512 variant (with and without VBMI) and AVX2, and E8M0
// exponents from the subnormal scales (e = 0, 1) to 2^122.
TEST(VecDotMxfp4, EveryKernelVariantMatchesScalarReference) {
  std::vector<std::pair<std::string, VecDotFn>> kernels;
  if (isa_supported(Isa::Avx2))
    kernels.push_back({"avx2", vec_dot_kernel(GgmlType::MXFP4, Isa::Avx2)});
  for (bool vbmi : {false, true}) {
    if (VecDotFn k = vec_dot_kernel_mxfp4_avx512(vbmi)) {
      kernels.push_back({vbmi ? "avx512 vbmi" : "avx512", k});
    }
  }
  EXPECT_EQ(vec_dot_kernel(GgmlType::MXFP4, Isa::Avx512),
            vec_dot_kernel_mxfp4_avx512(avx512_vbmi_supported()));
  const ActFormat fmt = act_format_for(GgmlType::MXFP4);
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  std::vector<int64_t> block_counts;
  for (int64_t b = 1; b <= 25; ++b) block_counts.push_back(b);
  for (int64_t b : {63, 90, 131}) block_counts.push_back(b);  // 90: gpt-oss's 2880
  for (int64_t blocks : block_counts) {
    // 0: random_row's ordinary exponents; 1: only subnormal and tiny scales (2^-128..2^-123);
    // 2: scales up to 2^122 next to ordinary ones, with activations (d) small enough that nothing
    // overflows (the reference dequantizes to float, where 12 * 2^127 is inf; tiny scales times
    // tiny d would leave float's range).
    for (int kind : {0, 1, 2}) {
      const int64_t n = 32 * blocks;
      auto w = test::random_row(GgmlType::MXFP4, n, rng);
      const uint8_t tiny[] = {0, 1, 2, 3, 4, 5};
      const uint8_t wide[] = {60, 100, 127, 128, 200, 240, 250};
      for (int64_t b = 0; kind > 0 && b < blocks; ++b) {
        w[static_cast<size_t>(17 * b)] =
            kind == 1 ? tiny[(b + blocks) % 6] : wide[(b + blocks) % 7];
      }
      const size_t stride = act_row_bytes(fmt, n) + 64;
      std::vector<uint8_t> act(stride * kMaxActRows);
      std::vector<float> wdeq(static_cast<size_t>(n)), adeq(static_cast<size_t>(n));
      dequantize_row(GgmlType::MXFP4, w.data(), wdeq.data(), n);
      for (int r = 0; r < kMaxActRows; ++r) {
        auto x = test::random_floats(n, rng);
        for (float& v : x) v *= kind == 2 ? 1e-5f : 1.0f;
        quantize_act_row(fmt, x.data(), act.data() + r * stride, n, best_isa());
      }
      float want[kMaxActRows];
      vec_dot_ref(GgmlType::MXFP4, n, w.data(), act.data(), stride, kMaxActRows, want);
      for (const auto& [name, kernel] : kernels) {
        for (int n_act = 1; n_act <= kMaxActRows; ++n_act) {
          float got[kMaxActRows];
          kernel(n, w.data(), act.data(), stride, n_act, got);
          for (int r = 0; r < n_act; ++r) {
            dequantize_act_row(fmt, act.data() + r * stride, adeq.data(), n);
            double mag = 0;
            for (int64_t i = 0; i < n; ++i)
              mag += std::fabs(static_cast<double>(wdeq[i]) * adeq[i]);
            const double err = std::fabs(static_cast<double>(got[r]) - want[r]);
            EXPECT_LE(err, 1e-5 * mag)
                << name << " blocks=" << blocks << " kind=" << kind << " n_act=" << n_act << " row "
                << r << " got " << got[r] << " want " << want[r];
            // A row's sum is the same bits in any batch (exact speculative decoding).
            float alone;
            kernel(n, w.data(), act.data() + r * stride, stride, 1, &alone);
            EXPECT_EQ(alone, got[r]) << name << " blocks=" << blocks << " row " << r;
          }
        }
      }
    }
  }
}

TEST(VecDotDispatch, EveryComputableTypeHasAKernelForEverySupportedIsa) {
  for (GgmlType t : test::computable_types()) {
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      EXPECT_NE(vec_dot_kernel(t, isa), nullptr) << ggml_type_info_or_throw(t).name;
    }
  }
  EXPECT_EQ(vec_dot_kernel(GgmlType::IQ2_XXS, Isa::Avx2), nullptr);
  std::printf("vec_dot ISAs executed on this CPU: scalar%s%s\n",
              isa_supported(Isa::Avx2) ? " avx2" : "", isa_supported(Isa::Avx512) ? " avx512" : "");
}

}  // namespace
}  // namespace moe::cpu
