// Context shift of one attention layer's K/V rows in VRAM (llama-server's --context-shift), byte
// for byte what coordinator/model/kv_shift.cpp does to a host cache.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention.h"

namespace moe::cuda {

// The largest n_rot kv_shift takes: the cos/sin table travels in the launch's parameters.
constexpr int64_t kKvShiftMaxRot = 512;

// Rows [n_keep + n_discard, n_past) of `kv` move down to n_keep. Each K row is decoded, rotated
// back (Hadamard, when kv.k_rot), roped by `cs` (host memory, n_rot floats in rope_angles' layout:
// the host's angles of position -n_discard, so that the result equals the CPU shift's), rotated
// again and re-encoded as kv_store() stores floats; V rows are copied as bytes. K heads have
// head_dim values (kv.k_elems a multiple of it), the first n_rot of each rotated (NEOX pairs).
// Rows move upwards in chunks of at most n_discard rows, so that no chunk writes a row that it or
// a later chunk still reads; a chunk's K floats go through `scratch` (scratch_floats >= k_elems,
// its size bounds the chunk). Throws moe::Error on bad arguments before anything is enqueued;
// enqueued on `stream`.
void kv_shift(const DeviceKvLayer& kv, int64_t n_past, int64_t n_keep, int64_t n_discard,
              int64_t head_dim, int64_t n_rot, const float* cs, float* scratch,
              size_t scratch_floats, cudaStream_t stream);

}  // namespace moe::cuda
