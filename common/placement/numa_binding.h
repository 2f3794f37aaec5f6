// Memory placement for a worker process: keep the buffers it allocates on its own NUMA node.
#pragma once

#include <string>

namespace moe::placement {

// Prefers NUMA node `node` for the calling thread's future allocations, and for the threads it
// starts afterwards (they inherit the policy): call it in a worker's main() before any thread pool
// or buffer exists, so first-touched activations and scratch land on the worker's node.
// Model weights are unaffected: they stay mmapped from the GGUF file and their pages live wherever
// the page cache put them.
//
// node < 0 and a machine without NUMA support leave the policy unchanged. Returns one line saying
// what happened ("memory preferred on NUMA node 1", "NUMA not available: memory policy unchanged",
// or why the kernel refused). Throws moe::Error when `node` is not a configured NUMA node.
std::string bind_memory_to_node(int node);

}  // namespace moe::placement
