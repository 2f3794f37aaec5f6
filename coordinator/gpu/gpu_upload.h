// What every GPU forward does at load: pick the device and its VRAM budget, and copy a model's
// dense weights into VRAM through that budget; plus the grow-only device scratch of a forward.
#pragma once

#include <span>
#include <string>

#include "common/gguf.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/gpu/vram_budget.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

// Makes --main-gpu current and returns the budget in bytes (--vram-budget-mib, else the device's
// free memory); `name` gets "NAME (sm_XY)". Throws moe::Error when no usable device exists.
uint64_t select_device(const GpuOptions& opt, std::string& name);

// A weight matrix in VRAM in its file type (throws when the GPU kernels lack that type).
cuda::DeviceMatrix upload_matrix(VramBudget& budget, const gguf::TensorInfo& t, VramBuffer& buf,
                                 VramUse use);
// Matrices of one type and input width stacked row-wise into one VRAM matrix, so one launch
// computes all their outputs side by side (a token's q, k and v in one row); throws when their
// types or input widths differ.
cuda::DeviceMatrix upload_stacked(VramBudget& budget, std::span<const gguf::TensorInfo* const> ts,
                                  VramBuffer& buf, VramUse use, const std::string& what);
// A norm or bias vector, converted to f32.
VramBuffer upload_vector(VramBudget& budget, const gguf::TensorInfo& t);
// A host f32 array (e.g. weights re-laid out at load).
VramBuffer upload_floats(VramBudget& budget, const float* data, size_t n, const std::string& what);

// Grows `b` to at least `floats` floats (never shrinks); the old buffer is freed first so the
// budget sees only the new size.
float* grow_scratch(VramBudget& budget, VramBuffer& b, size_t floats, const char* what);

}  // namespace moe::gpu
