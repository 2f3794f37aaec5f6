// The GPU context shift (kernels/cuda/kv_shift.cu) against the CPU shift of a host KvCache
// (coordinator/model/kv_shift.cpp), byte for byte, on random rows: every cache type for K and V,
// Hadamard-rotated and not, odd n_keep / n_discard, a whole and a partial RoPE, and scratch that
// holds fewer rows than a chunk could (several chunks per shift).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/kv_shift.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/kv_shift.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

using model::KvType;

// Two attention layers of n_head_kv heads; only what KvCache and the shift read.
model::ModelConfig config(int64_t head_dim, int64_t n_rot, int64_t n_head_kv) {
  model::ModelConfig c;
  c.arch = "qwen3moe";
  c.n_layer = 2;
  c.n_head = {2 * n_head_kv, 2 * n_head_kv};
  c.n_head_kv = {n_head_kv, n_head_kv};
  c.head_dim_k = c.head_dim_v = head_dim;
  c.n_rot = n_rot;
  c.rope_freq_base = 1000000.0f;
  return c;
}

// One side of every layer: the host rows [0, n_ctx) as bytes.
std::vector<uint8_t> side_bytes(model::KvCache& cache, int64_t layer, bool k) {
  std::vector<uint8_t> out;
  for (int64_t p = 0; p < cache.n_ctx(); ++p) {
    const std::span<uint8_t> row = k ? cache.k_row_data(layer, p) : cache.v_row_data(layer, p);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

struct Shape {
  int64_t head_dim, n_rot, n_head_kv, n_past, n_keep, n_discard, scratch_rows;
};

void shift_and_compare(const model::ModelConfig& cfg, const model::KvConfig& kv, const Shape& s,
                       std::mt19937& rng) {
  const int64_t n_ctx = s.n_past + 3;
  model::KvCache cache(cfg, n_ctx, kv);
  for (int64_t p = 0; p < s.n_past; ++p) {
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      const std::vector<float> k = test::random_floats(cache.k_row_elems(l), rng);
      const std::vector<float> v = test::random_floats(cache.v_row_elems(l), rng);
      cache.store(l, p, k.data(), v.data());
    }
  }
  cache.advance(s.n_past);
  std::vector<DeviceBuffer> k_dev, v_dev;
  std::vector<DeviceKvLayer> views;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    k_dev.push_back(test::to_device(side_bytes(cache, l, true)));
    v_dev.push_back(test::to_device(side_bytes(cache, l, false)));
    views.push_back({model::kv_ggml_type(cache.k_type(l)), model::kv_ggml_type(cache.v_type(l)),
                     k_dev.back().get(), v_dev.back().get(), cache.k_row_data(l, 0).size(),
                     cache.v_row_data(l, 0).size(), cache.k_row_elems(l), cache.v_row_elems(l),
                     n_ctx, cache.k_rotation(l), cache.v_rotation(l)});
  }
  const std::vector<float> cs = model::shift_angles(cfg, s.n_discard);
  const size_t scratch_floats = static_cast<size_t>(s.scratch_rows * cache.k_row_elems(0));
  DeviceBuffer scratch(scratch_floats * sizeof(float));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    kv_shift(views[static_cast<size_t>(l)], s.n_past, s.n_keep, s.n_discard, cfg.head_dim_k,
             cfg.n_rot, cs.data(), scratch.as<float>(), scratch_floats, nullptr);
  }
  model::shift_kv(cache, cfg, s.n_keep, s.n_discard);
  ASSERT_EQ(cache.n_past(), s.n_past - s.n_discard);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    for (const bool k : {true, false}) {
      SCOPED_TRACE(std::string("layer ") + std::to_string(l) + (k ? " K" : " V"));
      const size_t row = (k ? cache.k_row_data(l, 0) : cache.v_row_data(l, 0)).size();
      const size_t live = row * static_cast<size_t>(cache.n_past());
      const std::vector<uint8_t> want = side_bytes(cache, l, k);
      const std::vector<uint8_t> got = test::to_host<uint8_t>(
          k ? k_dev[static_cast<size_t>(l)] : v_dev[static_cast<size_t>(l)], want.size());
      ASSERT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + static_cast<ptrdiff_t>(live)),
                std::vector<uint8_t>(want.begin(), want.begin() + static_cast<ptrdiff_t>(live)));
    }
  }
}

TEST(KvShiftCuda, MatchesTheCpuShiftByteForByte) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const KvType types[] = {KvType::F32,  KvType::F16,  KvType::BF16, KvType::Q8_0,  KvType::Q5_0,
                          KvType::Q5_1, KvType::Q4_0, KvType::Q4_1, KvType::IQ4_NL};
  // Head 128 (K rotated in blocks of 128, V of 64), whole RoPE, scratch for 4 of 13 rows; head
  // 64, RoPE over half the head, scratch bigger than n_discard; n_keep 0.
  const Shape shapes[] = {
      {128, 128, 2, 41, 5, 13, 4}, {64, 32, 4, 30, 3, 7, 64}, {128, 128, 1, 20, 0, 9, 9}};
  for (const Shape& s : shapes) {
    const model::ModelConfig cfg = config(s.head_dim, s.n_rot, s.n_head_kv);
    for (const bool rotate : {true, false}) {
      for (size_t i = 0; i < std::size(types); ++i) {
        // Every type as K, each V type once beside it (the next one), rotated and not.
        model::KvConfig kv = model::KvConfig::uniform(types[i], types[(i + 1) % std::size(types)]);
        kv.rotate = rotate;
        SCOPED_TRACE("head " + std::to_string(s.head_dim) + " K " +
                     std::string(model::kv_type_name(kv.k)) + " V " +
                     std::string(model::kv_type_name(kv.v)) + (rotate ? " rotated" : ""));
        shift_and_compare(cfg, kv, s, rng);
      }
    }
  }
}

TEST(KvShiftCuda, RefusesBadArguments) {
  // Never dereferenced: every check comes before anything is enqueued.
  void* fake = reinterpret_cast<void*>(256);
  const DeviceKvLayer kv{GgmlType::F16, GgmlType::F16, fake, fake, 256, 256, 128, 128, 16, 0, 0};
  std::vector<float> cs(128, 1.0f);
  float* scratch = reinterpret_cast<float*>(256);
  const auto shift = [&](const DeviceKvLayer& k, int64_t past, int64_t keep, int64_t discard,
                         int64_t n_rot, size_t floats) {
    kv_shift(k, past, keep, discard, 64, n_rot, cs.data(), scratch, floats, nullptr);
  };
  test::expect_error([&] { shift(kv, 10, 5, 6, 64, 1024); }, "cannot drop");
  test::expect_error([&] { shift(kv, 10, -1, 2, 64, 1024); }, "cannot drop");
  test::expect_error([&] { shift(kv, 10, 2, 0, 64, 1024); }, "cannot drop");
  test::expect_error([&] { shift(kv, 17, 2, 4, 64, 1024); }, "cannot drop");
  test::expect_error([&] { shift(kv, 10, 2, 4, 65, 1024); }, "rope dimension");
  test::expect_error([&] { shift(kv, 10, 2, 4, 128, 1024); }, "rope dimension");
  test::expect_error([&] { shift(kv, 10, 2, 4, 64, 100); }, "scratch");
  DeviceKvLayer rotated = kv;
  rotated.k_rot = 96;
  test::expect_error([&] { shift(rotated, 10, 2, 4, 64, 1024); }, "Hadamard block");
  DeviceKvLayer mxfp4 = kv;  // a 4-bit type the cache does not offer
  mxfp4.k_type = GgmlType::MXFP4;
  test::expect_error([&] { shift(mxfp4, 10, 2, 4, 64, 1024); }, "not supported on the GPU");
}

}  // namespace
}  // namespace moe::cuda
