// A quantized (or float) weight matrix that lives in device memory, in ggml's row layout, and the
// list of weight types the CUDA kernels can dequantize.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cuda {

// A 2-D weight in ggml layout on the device: n_out rows of n_in elements, row o at
// data + o * row_bytes.
struct DeviceMatrix {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  size_t row_bytes = 0;
};

// True for every type the CUDA kernels decode (the types kernels/cpu/dequant.cpp handles).
bool cuda_type_supported(GgmlType t);

// Byte alignment the kernels need for the start of every row of type t (1, 2 or 4): the kernels
// read 16/32-bit words inside blocks. Any cudaMalloc pointer plus a multiple of the row size is
// aligned enough.
size_t cuda_type_alignment(GgmlType t);

// Builds one, checking the type is supported, n_in is a positive multiple of its block size,
// n_out >= 1, data is not null and aligned (moe::Error otherwise); row_bytes from ggml_row_bytes.
DeviceMatrix make_device_matrix(GgmlType type, const void* data, int64_t n_in, int64_t n_out);

// Throws moe::Error (naming `what`) unless w is a usable matrix: the checks of make_device_matrix,
// plus row_bytes at least the packed row size and a multiple of the type's alignment.
void check_device_matrix(const DeviceMatrix& w, const char* what);

}  // namespace moe::cuda
