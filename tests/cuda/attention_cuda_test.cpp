// kv_store (bytes equal the CPU cache's encodings) and attention (against the CPU's
// double-precision reference, cpu::attend_rows_ref, over the cache decoded by
// cpu::dequantize_row), for every cache type (F32, F16, BF16, Q8_0, Q5_x, Q4_x, IQ4_NL), GQA,
// prefill and long-context decode (the split + merge path), with and without gpt-oss's mask
// (sliding window, attention sinks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

// The CPU cache's encoding of one row.
std::vector<uint8_t> encode_row(GgmlType t, const float* x, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(*ggml_row_bytes(t, static_cast<uint64_t>(n))));
  cpu::encode_kv_row(t, x, out.data(), n);
  return out;
}

struct Shape {
  int64_t n_head, n_head_kv, hd_k, hd_v;
};

struct Cache {
  DeviceKvLayer kv{};
  cuda::DeviceBuffer k, v;
};

// `ring` > 0: a sliding-window ring of that many rows (DeviceKvLayer::ring) for n_ctx positions.
Cache make_cache(GgmlType kt, GgmlType vt, const Shape& s, int64_t n_ctx, int64_t ring = 0) {
  Cache c;
  c.kv.k_type = kt;
  c.kv.v_type = vt;
  c.kv.k_elems = s.n_head_kv * s.hd_k;
  c.kv.v_elems = s.n_head_kv * s.hd_v;
  c.kv.k_row_bytes = static_cast<size_t>(*ggml_row_bytes(kt, static_cast<uint64_t>(c.kv.k_elems)));
  c.kv.v_row_bytes = static_cast<size_t>(*ggml_row_bytes(vt, static_cast<uint64_t>(c.kv.v_elems)));
  c.kv.n_ctx = n_ctx;
  c.kv.ring = ring;
  const auto rows = static_cast<size_t>(ring > 0 ? ring : n_ctx);
  c.k = cuda::DeviceBuffer(c.kv.k_row_bytes * rows);
  c.v = cuda::DeviceBuffer(c.kv.v_row_bytes * rows);
  // Unwritten rows hold NaN bit patterns: attention must never read them.
  MOE_CUDA_CHECK(cudaMemset(c.k.get(), 0xFF, c.k.size()));
  MOE_CUDA_CHECK(cudaMemset(c.v.get(), 0xFF, c.v.size()));
  c.kv.k = c.k.get();
  c.kv.v = c.v.get();
  return c;
}

// Decoded rows [0, n) of one side of the cache.
std::vector<float> decode_cache(const cuda::DeviceBuffer& b, GgmlType t, size_t row_bytes,
                                int64_t elems, int64_t n) {
  const auto bytes = test::to_host<uint8_t>(b, row_bytes * static_cast<size_t>(n));
  std::vector<float> out(static_cast<size_t>(n * elems));
  for (int64_t p = 0; p < n; ++p) {
    cpu::dequantize_row(t, bytes.data() + p * row_bytes, out.data() + p * elems, elems);
  }
  return out;
}

struct Param {
  GgmlType k_type, v_type;
  Shape shape;
  int64_t n_tokens, pos0;
  bool tensor_cores = false;  // on sm_80 and newer the tensor-core kernel must serve this call
  int64_t window = 0;         // AttentionMask::window
  bool sinks = false;         // fresh random AttentionMask::sinks
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  const auto tn = [](GgmlType t) { return std::string(ggml_type_info_or_throw(t).name); };
  return tn(p.k_type) + "_" + tn(p.v_type) + "_h" + std::to_string(p.shape.n_head) + "kv" +
         std::to_string(p.shape.n_head_kv) + "_d" + std::to_string(p.shape.hd_k) + "x" +
         std::to_string(p.shape.hd_v) + "_n" + std::to_string(p.n_tokens) + "_pos" +
         std::to_string(p.pos0) + (p.window > 0 ? "_w" + std::to_string(p.window) : "") +
         (p.sinks ? "_sinks" : "");
}

// Sink logits for n_head heads: every third one large enough to dominate the n_vis positions'
// scores (their sum is about n_vis), the others comparable with the scores, above and below.
std::vector<float> random_sinks(int64_t n_head, int64_t n_vis, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> s(static_cast<size_t>(n_head));
  for (int64_t h = 0; h < n_head; ++h) {
    s[static_cast<size_t>(h)] =
        h % 3 == 1 ? std::log(static_cast<float>(n_vis)) + 5.0f + u(rng) : u(rng);
  }
  return s;
}

// ||got - want|| / ||want|| of each output row (a query head of a token), the largest: a sink
// that dominates leaves its heads' rows small, where the whole output's error would not see
// them.
double worst_row_error(const std::vector<float>& got, const std::vector<double>& want,
                       int64_t row) {
  double worst = 0;
  for (size_t r = 0; r * static_cast<size_t>(row) < want.size(); ++r) {
    const auto b = static_cast<std::ptrdiff_t>(r * static_cast<size_t>(row));
    const std::vector<float> g(got.begin() + b, got.begin() + b + row);
    const std::vector<double> w(want.begin() + b, want.begin() + b + row);
    worst = std::max(worst, test::normalized_error(g, w));
  }
  return worst;
}

constexpr GgmlType F32 = GgmlType::F32, F16 = GgmlType::F16, Q8 = GgmlType::Q8_0,
                   Q4 = GgmlType::Q4_0, BF = GgmlType::BF16, Q41 = GgmlType::Q4_1,
                   Q50 = GgmlType::Q5_0, Q51 = GgmlType::Q5_1, NL = GgmlType::IQ4_NL;

class AttentionCudaTest : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionCudaTest, StoreAndAttendMatchReference) {
  MOE_REQUIRE_GPU();
  const Param& P = GetParam();
  const Shape& s = P.shape;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t n_kv = P.pos0 + P.n_tokens;
  Cache c = make_cache(P.k_type, P.v_type, s, n_kv + 3);
  const int64_t ke = c.kv.k_elems, ve = c.kv.v_elems;

  // History (positions < pos0) in one call, then the batch: both through kv_store.
  const auto k_all = test::random_floats(n_kv * ke, rng);
  const auto v_all = test::random_floats(n_kv * ve, rng);
  const auto dk = test::to_device(k_all), dv = test::to_device(v_all);
  if (P.pos0 > 0) kv_store(c.kv, dk.as<float>(), dv.as<float>(), P.pos0, 0, nullptr);
  kv_store(c.kv, dk.as<float>() + P.pos0 * ke, dv.as<float>() + P.pos0 * ve, P.n_tokens, P.pos0,
           nullptr);

  // The stored bytes are exactly the CPU cache's.
  const auto kb = test::to_host<uint8_t>(c.k, c.kv.k_row_bytes * static_cast<size_t>(n_kv));
  const auto vb = test::to_host<uint8_t>(c.v, c.kv.v_row_bytes * static_cast<size_t>(n_kv));
  for (int64_t p = 0; p < n_kv; ++p) {
    const auto ek = encode_row(P.k_type, k_all.data() + p * ke, ke);
    const auto ev = encode_row(P.v_type, v_all.data() + p * ve, ve);
    ASSERT_EQ(std::memcmp(kb.data() + p * c.kv.k_row_bytes, ek.data(), ek.size()), 0)
        << "K row " << p;
    ASSERT_EQ(std::memcmp(vb.data() + p * c.kv.v_row_bytes, ev.data(), ev.size()), 0)
        << "V row " << p;
  }

  // q rows with a stride wider than the heads.
  const int64_t q_stride = s.n_head * s.hd_k + 8;
  const auto q = test::random_floats(P.n_tokens * q_stride, rng);
  const auto dq = test::to_device(q);
  const int64_t out_n = P.n_tokens * s.n_head * s.hd_v;
  cuda::DeviceBuffer dout(static_cast<size_t>(out_n) * sizeof(float));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd_k));
  const bool tc =
      attention_uses_tensor_cores(c.kv, P.n_tokens, s.n_head, s.n_head_kv, s.hd_k, s.hd_v);
  const std::vector<float> sinks =
      P.sinks ? random_sinks(s.n_head, P.window > 0 ? std::min(P.window, n_kv) : n_kv, rng)
              : std::vector<float>{};
  const auto dsinks = test::to_device(sinks);
  const AttentionMask mask{P.window, P.sinks ? dsinks.as<float>() : nullptr};
  // The tensor-core kernel is compiled only for sm_80+: chosen by the code the driver runs here
  // (kernel_arch), not by the card (an sm_89 card runs compute_75 code in a 75;90 build).
  if (P.tensor_cores && kernel_arch() >= 80) {
    EXPECT_TRUE(tc);
  }
  if (kernel_arch() < 80) {
    EXPECT_FALSE(tc);
  }
  // The f32 kernel serves every decode step and every f32 cache.
  if (P.n_tokens == 1 || P.k_type == F32 || P.v_type == F32) {
    EXPECT_FALSE(tc);
  }
  attention(c.kv, dq.as<float>(), q_stride, P.n_tokens, P.pos0, s.n_head, s.n_head_kv, s.hd_k,
            s.hd_v, scale, dout.as<float>(), nullptr, mask);
  const auto out = test::to_host<float>(dout, static_cast<size_t>(out_n));

  // The CPU's reference, one row per (token, query head), with the mask as
  // model::attention applies it: the window's first position, the head's sink.
  const auto K = decode_cache(c.k, P.k_type, c.kv.k_row_bytes, ke, n_kv);
  const auto V = decode_cache(c.v, P.v_type, c.kv.v_row_bytes, ve, n_kv);
  const int64_t group = s.n_head / s.n_head_kv;
  std::vector<float> want_f(static_cast<size_t>(out_n));
  for (int64_t t = 0; t < P.n_tokens; ++t) {
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t hk = h / group, n_vis = P.pos0 + t + 1;
      const int64_t first = P.window > 0 ? std::max<int64_t>(0, n_vis - P.window) : 0;
      cpu::AttendRows r;
      r.q = q.data() + t * q_stride + h * s.hd_k;
      r.n_rows = 1;
      r.n_vis = &n_vis;
      r.first_vis = &first;
      if (P.sinks) r.sinks = sinks.data() + h;
      r.k = K.data() + hk * s.hd_k;
      r.v = V.data() + hk * s.hd_v;
      r.k_stride = ke;
      r.v_stride = ve;
      r.hd_k = s.hd_k;
      r.hd_v = s.hd_v;
      r.scale = scale;
      r.out = want_f.data() + (t * s.n_head + h) * s.hd_v;
      cpu::attend_rows_ref(r);
    }
  }
  const std::vector<double> want(want_f.begin(), want_f.end());
  // Tensor cores round q, the cache rows and the probabilities to f16 (2^-11 relative each).
  EXPECT_LE(test::normalized_error(out, want), tc ? 3e-3 : 1e-5);
  // Each row on its own (a sink counted twice or a window's edge off by one shows in its rows).
  EXPECT_LE(worst_row_error(out, want, s.hd_v), tc ? 2e-2 : 1e-4);

  // Caller-provided scratch gives the same result bit for bit.
  const size_t ws = attention_workspace_bytes(P.n_tokens, P.pos0, s.n_head, s.n_head_kv, s.hd_v);
  cuda::DeviceBuffer dws(ws);
  cuda::DeviceBuffer dout2(static_cast<size_t>(out_n) * sizeof(float));
  attention(c.kv, dq.as<float>(), q_stride, P.n_tokens, P.pos0, s.n_head, s.n_head_kv, s.hd_k,
            s.hd_v, scale, dout2.as<float>(), dws.get(), ws, nullptr, nullptr, mask);
  EXPECT_EQ(test::to_host<float>(dout2, static_cast<size_t>(out_n)), out);

  // A position read on the device (CUDA graphs): the host passes 0, the device holds pos0. The
  // batch's K/V rows land where the host-position store put them, and attention over the fixed
  // grid for any position is bit-identical to the launch planned for this one.
  const auto dpos = test::to_device(std::vector<int32_t>{static_cast<int32_t>(P.pos0)});
  Cache c2 = make_cache(P.k_type, P.v_type, s, n_kv + 3);
  if (P.pos0 > 0) kv_store(c2.kv, dk.as<float>(), dv.as<float>(), P.pos0, 0, nullptr);
  kv_store(c2.kv, dk.as<float>() + P.pos0 * ke, dv.as<float>() + P.pos0 * ve, P.n_tokens, 0,
           nullptr, dpos.as<int32_t>());
  EXPECT_EQ(test::to_host<uint8_t>(c2.k, c.k.size()), test::to_host<uint8_t>(c.k, c.k.size()));
  EXPECT_EQ(test::to_host<uint8_t>(c2.v, c.v.size()), test::to_host<uint8_t>(c.v, c.v.size()));
  const size_t ws_dev =
      attention_workspace_bytes(P.n_tokens, 0, s.n_head, s.n_head_kv, s.hd_v, /*device_pos0=*/true);
  EXPECT_GE(ws_dev, ws);
  cuda::DeviceBuffer dws3(ws_dev);
  cuda::DeviceBuffer dout3(static_cast<size_t>(out_n) * sizeof(float));
  attention(c2.kv, dq.as<float>(), q_stride, P.n_tokens, 0, s.n_head, s.n_head_kv, s.hd_k, s.hd_v,
            scale, dout3.as<float>(), dws3.get(), ws_dev, nullptr, dpos.as<int32_t>(), mask);
  EXPECT_EQ(test::to_host<float>(dout3, static_cast<size_t>(out_n)), out);

  if (P.window > 0) {
    // A sliding-window ring of just the rows the batch needs (or a few more), the history stored
    // through it in steps that fit: bit for bit the full cache's result, the position on the host
    // and on the device.
    const int64_t ring = P.window + P.n_tokens - 1 + static_cast<int64_t>(rng() % 4);
    SCOPED_TRACE("ring " + std::to_string(ring));
    Cache r = make_cache(P.k_type, P.v_type, s, n_kv + 3, ring);
    for (int64_t p = 0; p < P.pos0; p += ring) {
      const int64_t m = std::min(ring, P.pos0 - p);
      kv_store(r.kv, dk.as<float>() + p * ke, dv.as<float>() + p * ve, m, p, nullptr);
    }
    kv_store(r.kv, dk.as<float>() + P.pos0 * ke, dv.as<float>() + P.pos0 * ve, P.n_tokens, 0,
             nullptr, dpos.as<int32_t>());
    ASSERT_EQ(attention_uses_tensor_cores(r.kv, P.n_tokens, s.n_head, s.n_head_kv, s.hd_k, s.hd_v),
              tc);
    cuda::DeviceBuffer dout5(static_cast<size_t>(out_n) * sizeof(float));
    attention(r.kv, dq.as<float>(), q_stride, P.n_tokens, P.pos0, s.n_head, s.n_head_kv, s.hd_k,
              s.hd_v, scale, dout5.as<float>(), nullptr, mask);
    EXPECT_EQ(test::to_host<float>(dout5, static_cast<size_t>(out_n)), out);
    attention(r.kv, dq.as<float>(), q_stride, P.n_tokens, 0, s.n_head, s.n_head_kv, s.hd_k, s.hd_v,
              scale, dout5.as<float>(), dws3.get(), ws_dev, nullptr, dpos.as<int32_t>(), mask);
    EXPECT_EQ(test::to_host<float>(dout5, static_cast<size_t>(out_n)), out);
    // A ring that would lose part of the first token's window, or rows of the batch itself, is
    // refused before anything runs.
    DeviceKvLayer small = r.kv;
    small.ring = P.window + P.n_tokens - 2;
    if (small.ring > 0) {
      test::expect_error(
          [&] {
            attention(small, dq.as<float>(), q_stride, P.n_tokens, P.pos0, s.n_head, s.n_head_kv,
                      s.hd_k, s.hd_v, scale, dout5.as<float>(), nullptr, mask);
          },
          "ring of");
    }
    small.ring = P.n_tokens - 1;
    if (small.ring > 0) {
      test::expect_error(
          [&] { kv_store(small, dk.as<float>(), dv.as<float>(), P.n_tokens, P.pos0, nullptr); },
          "sliding-window ring");
    }
  }

  if (P.window == 0 && !P.sinks) {
    // A mask that changes nothing is the unmasked computation, bit for bit: a window wider than
    // the cache (its first position is 0) and sinks of -inf (e^-inf = 0 joins the sum).
    const auto dnone =
        test::to_device(std::vector<float>(static_cast<size_t>(s.n_head), -INFINITY));
    const AttentionMask inert{n_kv + 1 + static_cast<int64_t>(rng() % 1000), dnone.as<float>()};
    cuda::DeviceBuffer dout4(static_cast<size_t>(out_n) * sizeof(float));
    attention(c.kv, dq.as<float>(), q_stride, P.n_tokens, P.pos0, s.n_head, s.n_head_kv, s.hd_k,
              s.hd_v, scale, dout4.as<float>(), nullptr, inert);
    EXPECT_EQ(test::to_host<float>(dout4, static_cast<size_t>(out_n)), out);
  }
}

constexpr Shape kGqa4x2{4, 2, 64, 64}, kGqa16x2{16, 2, 128, 128}, kHead256{8, 1, 256, 256},
    kMixed{4, 4, 96, 64};

std::vector<Param> params() {
  std::vector<Param> out;
  for (const auto& [kt, vt] :
       {std::pair{F32, F32}, std::pair{F16, F16}, std::pair{Q8, Q8}, std::pair{F16, Q8},
        std::pair{Q4, Q4}, std::pair{Q4, Q8}, std::pair{BF, BF}, std::pair{Q50, Q51},
        std::pair{Q41, Q41}, std::pair{NL, NL}, std::pair{F16, NL}}) {
    for (const Shape& s : {kGqa4x2, kGqa16x2}) {
      out.push_back({kt, vt, s, 7, 5});     // prefill after a short history
      out.push_back({kt, vt, s, 1, 2999});  // decode, 3000 positions: split + merge
      out.push_back({kt, vt, s, 7, 1000});  // prefill after a long history: split, causal
      out.push_back({kt, vt, s, 1, 0});     // the very first token
    }
  }
  for (const Shape& s : {kHead256, kMixed}) {
    out.push_back({F16, F16, s, 7, 5});
    out.push_back({Q8, F32, s, 1, 2999});
    out.push_back({Q4, Q4, s, 1, 2999});
  }
  out.push_back({F32, F32, kGqa4x2, 300, 40});  // a larger prefill: many query blocks
  // The decode kernel (at most 8 query rows per KV head): qwen3.6's heads deep in a chat, lengths
  // off the split and warp multiples, a few tokens at once with their causal mask, one row.
  constexpr Shape kQwen36{16, 2, 256, 256};
  out.push_back({Q4, Q4, kQwen36, 1, 40013});
  out.push_back({F16, F16, kQwen36, 1, 32766});
  out.push_back({Q8, Q8, kQwen36, 1, 8190});
  out.push_back({F16, Q4, kGqa16x2, 1, 20001});
  out.push_back({Q8, Q8, kGqa4x2, 3, 1000});               // 6 rows
  out.push_back({F16, F16, kGqa4x2, 4, 3});                // 8 rows, fewer positions than warps
  out.push_back({Q4, F16, Shape{2, 2, 128, 128}, 1, 77});  // one row per KV head
  out.push_back({BF, Q50, kQwen36, 1, 5003});              // the out-of-line decoders
  // Prompt batches on tensor cores: every cache type, row blocks and position tiles cut short
  // (77 tokens × 8 heads = 9.6 blocks of 64 rows; 1000 + 77 positions), unequal head dims, one
  // head per KV head, and depths to 40k (a chat's next turn), splits and the merge included.
  for (const auto& [kt, vt] :
       {std::pair{F16, F16}, std::pair{Q8, Q8}, std::pair{Q4, Q4}, std::pair{F16, Q8},
        std::pair{BF, BF}, std::pair{Q50, Q51}, std::pair{Q41, Q41}, std::pair{NL, NL}}) {
    out.push_back({kt, vt, kGqa16x2, 77, 1000, true});
  }
  out.push_back({F16, F16, kHead256, 33, 5, true});
  out.push_back({Q8, Q4, kHead256, 40, 3001, true});
  out.push_back({F16, F16, kMixed, 70, 100, true});
  out.push_back({Q4, Q4, kGqa16x2, 9, 40013, true});
  out.push_back({F16, F16, Shape{16, 2, 256, 256}, 16, 32771, true});
  // gpt-oss's mask: a sliding window, sinks, and both, on every kernel path and cache type.
  // Windows cut inside tiles and split slices (3000 positions, the last 128 seen), exceed the
  // position (100 < 128), see one position (1), or only part of a prompt batch (4 < 7 tokens).
  struct Mask {
    int64_t window;
    bool sinks;
  };
  for (const Mask m : {Mask{128, false}, Mask{0, true}, Mask{128, true}}) {
    for (const auto& [kt, vt] :
         {std::pair{F32, F32}, std::pair{F16, F16}, std::pair{Q8, Q8}, std::pair{Q4, Q4},
          std::pair{F16, Q8}, std::pair{BF, BF}, std::pair{Q50, Q51}, std::pair{NL, NL}}) {
      for (const Shape& s : {kGqa4x2, kGqa16x2}) {
        out.push_back({kt, vt, s, 1, 2999, false, m.window, m.sinks});  // decode: split + merge
        out.push_back({kt, vt, s, 1, 100, false, m.window, m.sinks});   // window > position
        out.push_back({kt, vt, s, 7, 1000, false, m.window, m.sinks});  // small prompt, split
      }
      out.push_back({kt, vt, kGqa4x2, 3, 1000, false, m.window, m.sinks});  // decode kernel, 6 rows
      if (kt != F32) out.push_back({kt, vt, kGqa16x2, 77, 1000, true, m.window, m.sinks});
    }
    out.push_back({Q4, Q4, kGqa4x2, 1, 0, false, m.window, m.sinks});  // the very first token
    out.push_back({F16, F16, kGqa4x2, 7, 5, false, m.window > 0 ? 4 : 0, m.sinks});
    out.push_back({F32, F32, kGqa4x2, 300, 40, false, m.window > 0 ? 64 : 0, m.sinks});
    out.push_back({Q8, F32, kHead256, 1, 2999, false, m.window > 0 ? 100 : 0, m.sinks});
    out.push_back({Q8, Q4, kHead256, 40, 3001, true, m.window > 0 ? 100 : 0, m.sinks});
    out.push_back({F16, F16, kMixed, 70, 100, true, m.window, m.sinks});
    out.push_back({Q4, Q4, kGqa16x2, 9, 40013, true, m.window > 0 ? 4096 : 0, m.sinks});
    out.push_back({Q4, Q4, Shape{64, 8, 64, 64}, 1, 4000, false, m.window, m.sinks});  // gpt-oss
    out.push_back({F16, F16, Shape{64, 8, 64, 64}, 1, 130000, false, m.window, m.sinks});
  }
  out.push_back({F16, F16, kGqa4x2, 1, 2999, false, 1, false});  // a window of one position
  out.push_back({Q8, Q8, kGqa16x2, 77, 1000, true, 1, true});
  out.push_back({F32, F32, kGqa16x2, 7, 50, false, 1, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Caches, AttentionCudaTest, ::testing::ValuesIn(params()), param_name);

// A device position that would put the batch past the cache is refused on the device: nothing is
// written (the bounds check is real, not the host's promise).
TEST(AttentionCuda, DevicePositionOutsideTheCacheWritesNothing) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(7);
  const Shape s = kGqa4x2;
  Cache c = make_cache(GgmlType::F16, GgmlType::Q8_0, s, 16);
  const auto before_k = test::to_host<uint8_t>(c.k, c.k.size());
  const auto before_v = test::to_host<uint8_t>(c.v, c.v.size());
  const auto dk = test::to_device(test::random_floats(2 * c.kv.k_elems, rng));
  const auto dv = test::to_device(test::random_floats(2 * c.kv.v_elems, rng));
  for (const int32_t bad : {15, 16, 1 << 30, -1}) {
    const auto dpos = test::to_device(std::vector<int32_t>{bad});
    kv_store(c.kv, dk.as<float>(), dv.as<float>(), 2, 0, nullptr, dpos.as<int32_t>());
    MOE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(test::to_host<uint8_t>(c.k, c.k.size()), before_k) << "device pos0 " << bad;
    EXPECT_EQ(test::to_host<uint8_t>(c.v, c.v.size()), before_v) << "device pos0 " << bad;
  }
}

// K and V read from one row holding q, k and v side by side (the fused projection's output)
// store the same bytes as from contiguous rows, for each cache type on each side.
TEST(AttentionCuda, StridedSourcesStoreTheSameBytes) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const Shape s = kGqa4x2;
  const int64_t n = 3, pos0 = 4;
  for (const auto& [kt, vt] :
       {std::pair{GgmlType::F32, GgmlType::F16}, std::pair{GgmlType::Q8_0, GgmlType::F32},
        std::pair{GgmlType::F16, GgmlType::Q8_0}, std::pair{GgmlType::Q4_0, GgmlType::Q4_0},
        std::pair{GgmlType::BF16, GgmlType::Q4_1}, std::pair{GgmlType::Q5_0, GgmlType::Q5_1},
        std::pair{GgmlType::IQ4_NL, GgmlType::F16}}) {
    Cache a = make_cache(kt, vt, s, 16), b = make_cache(kt, vt, s, 16);
    const int64_t ke = a.kv.k_elems, ve = a.kv.v_elems, q = s.n_head * s.hd_k;
    const int64_t stride = q + ke + ve;
    const auto rows = test::random_floats(n * stride, rng);
    std::vector<float> k(static_cast<size_t>(n * ke)), v(static_cast<size_t>(n * ve));
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(rows.begin() + t * stride + q, ke, k.begin() + t * ke);
      std::copy_n(rows.begin() + t * stride + q + ke, ve, v.begin() + t * ve);
    }
    const auto drows = test::to_device(rows), dk = test::to_device(k), dv = test::to_device(v);
    kv_store(a.kv, dk.as<float>(), dv.as<float>(), n, pos0, nullptr);
    kv_store(b.kv, drows.as<float>() + q, drows.as<float>() + q + ke, n, pos0, nullptr, nullptr,
             stride, stride);
    EXPECT_EQ(test::to_host<uint8_t>(a.k, a.k.size()), test::to_host<uint8_t>(b.k, b.k.size()));
    EXPECT_EQ(test::to_host<uint8_t>(a.v, a.v.size()), test::to_host<uint8_t>(b.v, b.v.size()));
    // And the bytes are the CPU cache's encodings.
    const auto got = test::to_host<uint8_t>(b.k, b.k.size());
    const auto want = encode_row(kt, k.data() + ke, ke);
    EXPECT_TRUE(std::equal(want.begin(), want.end(),
                           got.begin() + static_cast<int64_t>(a.kv.k_row_bytes) * (pos0 + 1)));
  }
}

// Host-side argument checks (no GPU needed: they throw before any CUDA call).
TEST(AttentionCuda, RejectsBadArguments) {
  auto* f = reinterpret_cast<float*>(uintptr_t{0x10000});
  DeviceKvLayer kv{};
  kv.k_type = kv.v_type = GgmlType::F16;
  kv.k = kv.v = reinterpret_cast<void*>(uintptr_t{0x20000});
  kv.k_elems = kv.v_elems = 2 * 64;
  kv.k_row_bytes = kv.v_row_bytes = 2 * 2 * 64;
  kv.n_ctx = 16;
  test::expect_error([&] { kv_store(kv, f, f, 4, 13, nullptr); }, "context length");
  test::expect_error([&] { kv_store(kv, f, f, 1, -1, nullptr); }, "context length");
  test::expect_error([&] { kv_store(kv, f, f, 1, 0, nullptr, nullptr, 100, 0); }, "stride");
  test::expect_error([&] { attention(kv, f, 256, 4, 13, 4, 2, 64, 64, 0.1f, f, nullptr); },
                     "context length");
  test::expect_error([&] { attention(kv, f, 256, 1, 0, 3, 2, 64, 64, 0.1f, f, nullptr); },
                     "KV heads");
  test::expect_error([&] { attention(kv, f, 256, 1, 0, 4, 2, 32, 64, 0.1f, f, nullptr); },
                     "do not match");
  test::expect_error([&] { attention(kv, f, 200, 1, 0, 4, 2, 64, 64, 0.1f, f, nullptr); },
                     "q_stride");
  test::expect_error([&] { attention(kv, nullptr, 256, 1, 0, 4, 2, 64, 64, 0.1f, f, nullptr); },
                     "null");
  test::expect_error(
      [&] { attention(kv, f, 256, 1, 0, 4, 2, 64, 64, 0.1f, f, nullptr, AttentionMask{-1}); },
      "window");
  test::expect_error(
      [&] {
        attention(kv, f, 256, 1, 0, 4, 2, 64, 64, 0.1f, f, nullptr, 0, nullptr, nullptr,
                  AttentionMask{-128, f});
      },
      "window");
  DeviceKvLayer nl = kv;  // a 4-bit type the cache does not offer
  nl.k_type = GgmlType::MXFP4;
  nl.k_row_bytes = 17 * 4;
  test::expect_error([&] { kv_store(nl, f, f, 1, 0, nullptr); }, "not supported on the GPU");
  DeviceKvLayer wide = kv;
  wide.k_elems = wide.v_elems = 2 * 512;
  wide.k_row_bytes = wide.v_row_bytes = 2 * 2 * 512;
  test::expect_error([&] { attention(wide, f, 1024, 1, 0, 2, 2, 512, 512, 0.1f, f, nullptr); },
                     "head dims");
}

// The architecture the kernels run as: one the build has code for (75 at least), never above what
// the device is.
TEST(KernelArch, IsABuiltArchitectureTheDeviceRuns) {
  MOE_REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const int arch = kernel_arch();
  std::printf("device sm_%d%d, kernels run as %d\n", major, minor, arch);
  EXPECT_GE(arch, 75);
  EXPECT_LE(arch, 10 * major + minor);
  EXPECT_EQ(kernel_arch(), arch);  // cached
}

}  // namespace
}  // namespace moe::cuda
