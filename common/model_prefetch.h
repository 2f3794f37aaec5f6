// Reads a model's tensor data into the page cache up front, with progress, so that the first
// requests do not page-fault the weights in one 4 KiB page at a time.
#pragma once

#include <cstdint>

#include "common/gguf.h"
#include "common/progress.h"

namespace moe::gguf {

// Total bytes of tensor data in the model (all shards): the `total` to give a Progress for
// prefetch_tensor_data.
uint64_t tensor_data_bytes(const GgufFile& file);

// Brings every tensor's bytes into memory once: madvise(MADV_WILLNEED) on each page-aligned chunk
// (up to 64 MiB of tensor data, never spanning two shards), then one volatile read per 4 KiB page.
// `threads` workers (at least 1, counting the caller) take chunks in file order; `progress`
// (may be null) advances by each chunk's tensor bytes. Only reads; padding between tensors is not
// counted. Returns the tensor bytes covered (== tensor_data_bytes(file)). Does not call
// progress->finish().
uint64_t prefetch_tensor_data(const GgufFile& file, Progress* progress, unsigned threads = 2);

}  // namespace moe::gguf
