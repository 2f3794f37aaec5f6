// matmul(): argument checks, then the weight-product kernel of the weight's type
// (matmul_kernels.cuh, instantiated per type family in matmul_float/blocks/kquants.cu).
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
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

// Compiled with the same architectures as the products: its PTX version is the __CUDA_ARCH__ the
// products run with on this device. A GPU without a matching SASS in the build runs the newest PTX
// that fits it (an sm_86 card with a 75;90 build: compute_75's), without the int8 mma.
__global__ void arch_probe_kernel() {}

}  // namespace

bool int8_products_enabled() {
  // Asked once per device: a driver call per launch would cost more than a small product.
  static std::array<std::atomic<int>, 64> cache{};  // 0 unknown, 1 no, 2 yes
  static const bool off = [] {
    const char* v = std::getenv("MOE_CUDA_MMQ");
    return v && std::strcmp(v, "0") == 0;
  }();
  if (off) return false;
  int dev = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < static_cast<int>(cache.size());
  if (cached) {
    if (const int known = cache[static_cast<size_t>(dev)].load(std::memory_order_relaxed)) {
      return known == 2;
    }
  }
  int major = 0;
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  cudaFuncAttributes attr{};
  MOE_CUDA_CHECK(cudaFuncGetAttributes(&attr, arch_probe_kernel));
  const bool yes = major >= 8 && attr.ptxVersion >= 80;
  if (cached) cache[static_cast<size_t>(dev)].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
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
