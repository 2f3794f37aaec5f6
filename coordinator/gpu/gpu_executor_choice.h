// Which GpuExecutor a GPU forward gets from --gpu-executor: a moe-gpu-worker process when asked
// for and MPS serves this process (two contexts are time-sliced without it, ~285 µs per layer
// hand-off measured on the H200 host), else the coordinator's own context, saying why.
#pragma once

#include <cstdint>
#include <memory>

#include "coordinator/gpu/gpu_options.h"
#include "experts/gpu/gpu_executor.h"

namespace moe::gpu {

// `budget_bytes`: the VRAM budget, which sizes the shared address range. The device of `opt`
// must be current. A worker that cannot start is reported in describe(), not thrown.
std::unique_ptr<GpuExecutor> make_gpu_executor(const GpuOptions& opt, uint64_t budget_bytes);

}  // namespace moe::gpu
