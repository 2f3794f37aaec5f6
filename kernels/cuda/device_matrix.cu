#include <cstdint>
#include <string>

#include "common/error.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {
namespace {

std::string label(GgmlType t) { return ggml_type_label(static_cast<uint32_t>(t)); }

}  // namespace

bool cuda_type_supported(GgmlType t) {
  return dq::try_dispatch(t, [](auto) {});
}

size_t cuda_type_alignment(GgmlType t) {
  size_t align = 0;
  dq::dispatch(t, "cuda_type_alignment", [&](auto dec) { align = decltype(dec)::kAlign; });
  return align;
}

void check_device_matrix(const DeviceMatrix& w, const char* what) {
  const std::string where(what);
  if (!cuda_type_supported(w.type)) {
    throw Error(where + ": weight type " + label(w.type) + " is not supported on the GPU");
  }
  const auto& info = ggml_type_info_or_throw(w.type);
  if (w.n_in < 1 || w.n_in % info.block_size != 0) {
    throw Error(where + ": n_in " + std::to_string(w.n_in) + " is not a positive multiple of the " +
                label(w.type) + " block size " + std::to_string(info.block_size));
  }
  if (w.n_out < 1) throw Error(where + ": n_out " + std::to_string(w.n_out) + " < 1");
  if (!w.data) throw Error(where + ": null weight data");
  const auto packed = ggml_row_bytes(w.type, static_cast<uint64_t>(w.n_in));
  const size_t align = cuda_type_alignment(w.type);
  if (!packed || w.row_bytes < *packed || w.row_bytes % align != 0) {
    throw Error(where + ": row_bytes " + std::to_string(w.row_bytes) + " is invalid for " +
                std::to_string(w.n_in) + " elements of " + label(w.type));
  }
  if (reinterpret_cast<uintptr_t>(w.data) % align != 0) {
    throw Error(where + ": weight data of type " + label(w.type) + " must be aligned to " +
                std::to_string(align) + " bytes");
  }
}

DeviceMatrix make_device_matrix(GgmlType type, const void* data, int64_t n_in, int64_t n_out) {
  DeviceMatrix w;
  w.type = type;
  w.data = data;
  w.n_in = n_in;
  w.n_out = n_out;
  if (!cuda_type_supported(type)) {
    throw Error("make_device_matrix: weight type " + label(type) + " is not supported on the GPU");
  }
  const auto bytes = n_in > 0 ? ggml_row_bytes(type, static_cast<uint64_t>(n_in)) : std::nullopt;
  w.row_bytes = bytes ? static_cast<size_t>(*bytes) : 0;
  check_device_matrix(w, "make_device_matrix");
  return w;
}

}  // namespace moe::cuda
