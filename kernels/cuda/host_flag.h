// A stream that waits for the host: one thread polls a counter in mapped page-locked host memory
// until it reaches a value. Used where stream memory operations are missing or, after a long
// wait, slow to notice the release (docs/performance-log.md, hand-off).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// Enqueues on `stream`: continue once (int32_t)(*flag - value) >= 0 (a cyclic comparison, so
// wrap-around is harmless). `flag` is the device pointer of mapped host memory. Occupies one
// thread of one SM while it waits.
void wait_host_flag(const uint32_t* flag, uint32_t value, cudaStream_t stream);

}  // namespace moe::cuda
