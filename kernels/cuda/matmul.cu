// matmul(): argument checks, then the weight-product kernel of the weight's type
// (matmul_kernels.cuh, instantiated per type family in matmul_float/blocks/kquants.cu).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/weight_product.h"

namespace moe::cuda {

namespace detail {

void launch_weight_product(const WeightProduct& p, cudaStream_t stream) {
  dq::dispatch(p.type, "matmul",
               [&](auto dec) { launch_weight_product_typed<decltype(dec)>(p, stream); });
}

}  // namespace detail

namespace {
// -1: as MOE_CUDA_MMQ says; 0 / 1: set_int8_products().
std::atomic<int> g_int8_override{-1};
}  // namespace

bool int8_products_enabled() {
  static const bool env_on = [] {
    const char* v = std::getenv("MOE_CUDA_MMQ");
    return v && std::strcmp(v, "1") == 0;
  }();
  const int o = g_int8_override.load(std::memory_order_relaxed);
  // The int8 mma is compiled for sm_75+ (m8n8k16 there): the code the driver runs here decides,
  // not the card (kernel_arch() is asked once per device).
  return (o < 0 ? env_on : o == 1) && kernel_arch() >= 75;
}

void set_int8_products(std::optional<bool> on) {
  g_int8_override.store(on ? (*on ? 1 : 0) : -1, std::memory_order_relaxed);
}

void matmul(const DeviceMatrix& w, const float* x, int64_t n_rows, float* y, cudaStream_t stream) {
  check_device_matrix(w, "matmul");
  if (n_rows < 1) throw Error("matmul: n_rows " + std::to_string(n_rows) + " < 1");
  if (!x || !y) throw Error("matmul: null activation or output pointer");
  if (w.n_out > (int64_t{1} << 32)) throw Error("matmul: n_out too large");
  detail::WeightProduct p;
  p.type = w.type;
  p.n_in = w.n_in;
  p.n_out = w.n_out;
  p.row_bytes = w.row_bytes;
  p.w = w.data;
  p.n_rows = n_rows;
  p.x = x;
  p.x_stride = w.n_in;
  p.y = y;
  p.max_rows_per_group = n_rows;
  detail::launch_weight_product(p, stream);
}

}  // namespace moe::cuda
