// The context shift on the device: per chunk of rows, a decode kernel (the attention's decoders),
// the Hadamard rotation back (hadamard_rows), a RoPE kernel with the host's table, the rotation
// again, and a store kernel (kv_store's encoders, kv_rows.cuh); V rows by one copy. Every step
// performs the CPU shift's float operations in its order, so the bytes match it.
#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hadamard.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/kv_shift.h"
#include "kernels/cuda/launch_util.cuh"

namespace moe::cuda {
namespace {

struct ShiftAngles {
  float cs[kKvShiftMaxRot];  // cos, sin of pair i at 2i, 2i + 1
};

// n_rows rows from `base` (row t at base + t * row_bytes) into out [n_rows, elems].
__global__ void decode_rows_kernel(const uint8_t* base, size_t row_bytes, int code, int64_t elems,
                                   int64_t n_rows, float* out) {
  for (int64_t i = grid_index(); i < n_rows * elems; i += grid_stride()) {
    const int64_t t = i / elems, e = i % elems;
    out[i] = kv_value_of(code, base + t * static_cast<int64_t>(row_bytes), e);
  }
}

// NEOX RoPE of every head (n_heads = rows * heads per row, contiguous) with one angle table.
__global__ void rope_heads_kernel(float* x, int64_t n_heads, int64_t head_dim, int64_t half,
                                  ShiftAngles a) {
  for (int64_t idx = grid_index(); idx < n_heads * half; idx += grid_stride()) {
    const int64_t i = idx % half;
    float* v = x + (idx / half) * head_dim;
    const float c = a.cs[2 * i], s = a.cs[2 * i + 1];
    const float x0 = v[i], x1 = v[i + half];
    // Each product rounded on its own, as the CPU's rope_neox (no FMA).
    v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[i + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

__global__ void store_rows_kernel(KvStoreSide s, int64_t n_rows, int64_t pos0) {
  kv_store_rows(s, n_rows, pos0);
}

void check_side(GgmlType type, const void* base, size_t row_bytes, int64_t elems,
                const char* side) {
  kv_code(type, "kv_shift");
  const auto packed = elems > 0 ? ggml_row_bytes(type, static_cast<uint64_t>(elems)) : std::nullopt;
  if (!base || !packed || row_bytes < *packed) {
    throw Error(std::string("kv_shift: the ") + side + " cache (" + std::to_string(elems) +
                " values per row of " + std::to_string(row_bytes) + " bytes) is invalid");
  }
}

}  // namespace

void kv_shift(const DeviceKvLayer& kv, int64_t n_past, int64_t n_keep, int64_t n_discard,
              int64_t head_dim, int64_t n_rot, const float* cs, float* scratch,
              size_t scratch_floats, cudaStream_t stream) {
  check_side(kv.k_type, kv.k, kv.k_row_bytes, kv.k_elems, "K");
  check_side(kv.v_type, kv.v, kv.v_row_bytes, kv.v_elems, "V");
  if (n_keep < 0 || n_discard < 1 || n_keep + n_discard > n_past || n_past > kv.n_ctx) {
    throw Error("kv_shift: cannot drop " + std::to_string(n_discard) + " positions after " +
                std::to_string(n_keep) + " of " + std::to_string(n_past) + " (context " +
                std::to_string(kv.n_ctx) + ")");
  }
  if (head_dim < 1 || kv.k_elems % head_dim != 0 || n_rot < 2 || n_rot % 2 != 0 ||
      n_rot > head_dim || n_rot > kKvShiftMaxRot || !cs) {
    throw Error("kv_shift: rope dimension " + std::to_string(n_rot) + " of K heads of " +
                std::to_string(head_dim) + " (rows of " + std::to_string(kv.k_elems) +
                ") is invalid, or no angles");
  }
  const int64_t rot = kv.k_rot;
  if (rot != 0 && (rot > 1024 || (rot & (rot - 1)) != 0 || kv.k_elems % rot != 0)) {
    throw Error("kv_shift: Hadamard block " + std::to_string(rot) + " does not divide K rows of " +
                std::to_string(kv.k_elems));
  }
  const int64_t n_move = n_past - n_keep - n_discard;
  if (n_move == 0) return;
  const auto rows_fit = static_cast<int64_t>(scratch_floats / static_cast<size_t>(kv.k_elems));
  if (!scratch || rows_fit < 1) {
    throw Error("kv_shift: scratch of " + std::to_string(scratch_floats) +
                " floats holds no K row of " + std::to_string(kv.k_elems));
  }
  ShiftAngles a{};
  std::copy(cs, cs + n_rot, a.cs);
  const int code = kv_code(kv.k_type, "kv_shift");
  const int64_t chunk = std::min(n_discard, rows_fit);
  auto* k = static_cast<uint8_t*>(kv.k);
  auto* v = static_cast<uint8_t*>(kv.v);
  const auto krb = static_cast<int64_t>(kv.k_row_bytes), vrb = static_cast<int64_t>(kv.v_row_bytes);
  for (int64_t done = 0; done < n_move; done += chunk) {
    const int64_t n = std::min(chunk, n_move - done);
    const int64_t src = n_keep + n_discard + done, dst = n_keep + done;
    const int64_t floats = n * kv.k_elems;
    decode_rows_kernel<<<elem_blocks(floats), kElemThreads, 0, stream>>>(
        k + src * krb, kv.k_row_bytes, code, kv.k_elems, n, scratch);
    MOE_CUDA_CHECK(cudaGetLastError());
    if (rot) hadamard_rows(scratch, n, kv.k_elems, kv.k_elems, rot, stream);
    const int64_t heads = floats / head_dim;
    rope_heads_kernel<<<elem_blocks(heads * (n_rot / 2)), kElemThreads, 0, stream>>>(
        scratch, heads, head_dim, n_rot / 2, a);
    MOE_CUDA_CHECK(cudaGetLastError());
    if (rot) hadamard_rows(scratch, n, kv.k_elems, kv.k_elems, rot, stream);
    const KvStoreSide side{k, kv.k_row_bytes, code, kv.k_elems, scratch, kv.k_elems, 0};
    store_rows_kernel<<<elem_blocks(floats), kElemThreads, 0, stream>>>(side, n, dst);
    MOE_CUDA_CHECK(cudaGetLastError());
    // n <= n_discard: the source and destination rows do not overlap.
    MOE_CUDA_CHECK(cudaMemcpyAsync(v + dst * vrb, v + src * vrb, static_cast<size_t>(n * vrb),
                                   cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace moe::cuda
