#include "common/model_prefetch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <system_error>
#include <thread>
#include <vector>

namespace moe::gguf {
namespace {

constexpr uint64_t kChunkBytes = 64ull << 20;
constexpr uintptr_t kTouchStride = 4096;

// A contiguous part of one tensor.
struct Piece {
  const uint8_t* data;
  uint64_t n;
};

// Pieces [first, last) of one shard, in address order, totalling at most kChunkBytes.
struct Chunk {
  size_t first;
  size_t last;
  uint64_t bytes;
};

uintptr_t page_size() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uintptr_t>(p) : 4096;
}

// Reads one byte in every 4 KiB page of the chunk's pieces (pages shared by neighbouring tensors
// once), never outside a piece. Returns a value derived from the bytes read.
unsigned touch(const std::vector<Piece>& pieces, const Chunk& c) {
  unsigned sum = 0;
  uintptr_t next_page = 0;  // first page not yet read
  for (size_t i = c.first; i < c.last; ++i) {
    const auto begin = reinterpret_cast<uintptr_t>(pieces[i].data);
    const uintptr_t end = begin + pieces[i].n;  // > begin
    for (uintptr_t page = std::max(begin / kTouchStride, next_page);
         page <= (end - 1) / kTouchStride; ++page) {
      const uintptr_t addr = std::max(page * kTouchStride, begin);
      sum += *reinterpret_cast<const volatile uint8_t*>(addr);
    }
    next_page = (end - 1) / kTouchStride + 1;
  }
  return sum;
}

void advise(const std::vector<Piece>& pieces, const Chunk& c, uintptr_t page) {
  const auto begin = reinterpret_cast<uintptr_t>(pieces[c.first].data) / page * page;
  const Piece& last = pieces[c.last - 1];
  const uintptr_t end = (reinterpret_cast<uintptr_t>(last.data) + last.n + page - 1) / page * page;
  // Advisory only: failure (e.g. for memory that is not a file mapping) changes nothing. The range
  // stays within the shard's mapping, which covers whole pages.
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

}  // namespace

uint64_t tensor_data_bytes(const GgufFile& file) {
  uint64_t total = 0;
  for (const TensorInfo& t : file.tensors()) {
    if (t.data != nullptr) total += t.n_bytes;
  }
  return total;
}

uint64_t prefetch_tensor_data(const GgufFile& file, Progress* progress, unsigned threads) {
  // Tensors in file order per shard: pointers of different shards point into different mappings,
  // so a chunk never mixes shards (the range between two of its pieces is then inside one map).
  std::vector<const TensorInfo*> order;
  order.reserve(file.tensors().size());
  for (const TensorInfo& t : file.tensors()) {
    if (t.data != nullptr && t.n_bytes > 0) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->shard != b->shard ? a->shard < b->shard : a->data < b->data;
  });

  std::vector<Piece> pieces;
  std::vector<Chunk> chunks;
  uint32_t chunk_shard = 0;
  for (const TensorInfo* t : order) {
    for (uint64_t off = 0; off < t->n_bytes;) {
      const bool fits =
          !chunks.empty() && chunk_shard == t->shard && chunks.back().bytes < kChunkBytes;
      if (!fits) {
        chunks.push_back(Chunk{pieces.size(), pieces.size(), 0});
        chunk_shard = t->shard;
      }
      Chunk& c = chunks.back();
      const uint64_t n = std::min(t->n_bytes - off, kChunkBytes - c.bytes);
      pieces.push_back(Piece{t->data + off, n});
      c.last = pieces.size();
      c.bytes += n;
      off += n;
    }
  }
  if (chunks.empty()) return 0;

  const uintptr_t page = page_size();
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> touched{0};
  std::atomic<unsigned> sink{0};  // keeps the reads observable
  auto work = [&] {
    unsigned local = 0;
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < chunks.size();) {
      advise(pieces, chunks[i], page);
      local += touch(pieces, chunks[i]);
      touched.fetch_add(chunks[i].bytes, std::memory_order_relaxed);
      if (progress) progress->advance(chunks[i].bytes);
    }
    sink.fetch_add(local, std::memory_order_relaxed);
  };

  const size_t n_threads = std::clamp<size_t>(threads, 1, chunks.size());
  {
    std::vector<std::jthread> helpers;
    try {
      for (size_t k = 1; k < n_threads; ++k) helpers.emplace_back(work);
    } catch (const std::system_error&) {
      // No more threads available: the ones started and this thread do all the chunks.
    }
    work();
  }  // joins the helpers
  return touched.load();
}

}  // namespace moe::gguf
