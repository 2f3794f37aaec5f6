#include "coordinator/gpu/gpu_upload.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

uint64_t select_device(const GpuOptions& o, std::string& name) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    throw Error(std::string("-ngl needs a CUDA device, none is usable: ") +
                (err != cudaSuccess ? cudaGetErrorString(err) : "no device"));
  }
  if (o.device < 0 || o.device >= count) {
    throw Error("--main-gpu " + std::to_string(o.device) + ": only " + std::to_string(count) +
                " CUDA device(s)");
  }
  MOE_CUDA_CHECK(cudaSetDevice(o.device));
  cudaDeviceProp prop{};
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
  size_t free_b = 0, total_b = 0;
  MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (o.vram_budget_mib > 0) return static_cast<uint64_t>(o.vram_budget_mib) << 20;
  return free_b;
}

cuda::DeviceMatrix upload_matrix(VramBudget& budget, const gguf::TensorInfo& t, VramBuffer& buf,
                                 VramUse use) {
  const cpu::WeightMatrix w = model::weight_matrix(t);
  if (!cuda::cuda_type_supported(t.type())) {
    throw Error(std::string(t.name) + ": type " + ggml_type_label(static_cast<uint32_t>(t.type())) +
                " is not supported on the GPU");
  }
  buf = budget.allocate(t.n_bytes, use, std::string(t.name));
  MOE_CUDA_CHECK(cudaMemcpy(buf.get(), t.data, t.n_bytes, cudaMemcpyHostToDevice));
  return cuda::make_device_matrix(t.type(), buf.get(), w.n_in, w.n_out);
}

cuda::DeviceMatrix upload_stacked(VramBudget& budget, std::span<const gguf::TensorInfo* const> ts,
                                  VramBuffer& buf, VramUse use, const std::string& what) {
  if (ts.empty()) throw Error(what + ": nothing to stack");
  const gguf::TensorInfo& first = *ts[0];
  const int64_t n_in = model::weight_matrix(first).n_in;
  int64_t n_out = 0;
  uint64_t bytes = 0;
  for (const gguf::TensorInfo* t : ts) {
    const cpu::WeightMatrix w = model::weight_matrix(*t);
    if (t->type() != first.type() || w.n_in != n_in) {
      throw Error(what + ": " + std::string(t->name) + " differs from " + std::string(first.name) +
                  " in type or input width");
    }
    n_out += w.n_out;
    bytes += t->n_bytes;
  }
  if (!cuda::cuda_type_supported(first.type())) {
    throw Error(what + ": type " + ggml_type_label(static_cast<uint32_t>(first.type())) +
                " is not supported on the GPU");
  }
  buf = budget.allocate(bytes, use, what);
  uint64_t off = 0;
  for (const gguf::TensorInfo* t : ts) {
    MOE_CUDA_CHECK(
        cudaMemcpy(buf.as<unsigned char>() + off, t->data, t->n_bytes, cudaMemcpyHostToDevice));
    off += t->n_bytes;
  }
  return cuda::make_device_matrix(first.type(), buf.get(), n_in, n_out);
}

VramBuffer upload_floats(VramBudget& budget, const float* data, size_t n, const std::string& what) {
  VramBuffer b = budget.allocate(std::max<size_t>(n, 1) * sizeof(float), VramUse::Weights, what);
  if (n > 0) MOE_CUDA_CHECK(cudaMemcpy(b.get(), data, n * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

VramBuffer upload_vector(VramBudget& budget, const gguf::TensorInfo& t) {
  const std::vector<float> v = model::vector_f32(t);
  return upload_floats(budget, v.data(), v.size(), std::string(t.name));
}

float* grow_scratch(VramBudget& budget, VramBuffer& b, size_t floats, const char* what) {
  const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
  if (b.size() < bytes) {
    b = VramBuffer{};
    b = budget.allocate(bytes, VramUse::Scratch, what);
  }
  return b.as<float>();
}

}  // namespace moe::gpu
