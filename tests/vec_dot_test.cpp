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
