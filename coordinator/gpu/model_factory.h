// Builds the model a tool asked for: the CPU forward, or (with -ngl) the GPU forward. Tools
// built without CUDA get a clear error instead of a GPU flag that silently does nothing.
#pragma once

#include <memory>
#include <string>

#include "coordinator/gpu/gpu_options.h"
#include "coordinator/model/model_arch.h"

namespace moe::gpu {

// `experts` computes the routed experts that run on the CPU (null: in-process). `placement`, if
// given, receives a one-line description of where the model lives (printed at start).
std::unique_ptr<model::ModelArch> create_model(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                                               std::unique_ptr<model::ExpertExecutor> experts,
                                               const GpuOptions& opt,
                                               std::string* placement = nullptr);

// True when this build can run models on a GPU.
bool built_with_cuda();

}  // namespace moe::gpu
