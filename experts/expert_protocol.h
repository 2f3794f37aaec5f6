// The coordinator <-> expert-worker protocol over one shared-memory segment (DESIGN.md §2-§3).
// The coordinator creates and formats the segment; one worker attaches to it. Layout, each part
// 64-byte aligned:
//   ExpertSegmentHeader | request ring | response ring | x | items | out
// A request says "run layer L on the first n_tokens rows of x and the first n_items items"; the
// worker writes out[t] = sum over the items of token t, in item order, of weight * expert(x[t])
// (rows without items zero) and answers with the same seq. Only integers, floats and atomics live
// in shared memory, so each side may map it anywhere; everything the worker reads is untrusted and
// checked (attach_expert_segment, and the worker's per-request validation).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/shm/spsc_ring.h"

namespace moe::shm {

inline constexpr uint64_t kExpertMagic = 0x31505845454f4dULL;  // "MOEEXP1" in memory order
inline constexpr uint32_t kExpertVersion = 1;
// One request is in flight at a time today; a few slots leave room for pipelining later.
inline constexpr uint32_t kExpertRingCapacity = 4;
// Bounds on the header's sizes, far above any real model, so a corrupt header cannot make the
// layout arithmetic or the worker's buffers absurd.
inline constexpr int64_t kExpertMaxEmbd = 1 << 20;
inline constexpr int64_t kExpertMaxTokens = 1 << 20;
inline constexpr int64_t kExpertMaxItems = 1 << 24;

enum class ExpertRequestKind : uint32_t { Run = 1, Shutdown = 2 };
enum class ExpertStatus : int32_t { Ok = 0, BadRequest = 1, Failed = 2 };

struct ExpertRequest {
  uint64_t seq;
  int32_t layer;
  int32_t n_tokens;
  int32_t n_items;
  uint32_t kind;  // ExpertRequestKind
};

struct ExpertResponse {
  uint64_t seq;
  int32_t status;     // ExpertStatus; anything else is an error too
  char message[200];  // NUL-terminated when written by our worker; readers use strnlen
};

// Same layout as model::ExpertItem (checked where the two meet).
struct ExpertWorkItem {
  int32_t token;
  int32_t expert;
  float weight;
};

static_assert(std::is_trivially_copyable_v<ExpertRequest> &&
              std::is_trivially_copyable_v<ExpertResponse> &&
              std::is_trivially_copyable_v<ExpertWorkItem>);

struct ExpertSegmentHeader {
  std::atomic<uint64_t> magic;  // stored last by the coordinator
  uint32_t version;
  uint32_t reserved;
  int64_t n_embd;
  int64_t max_tokens;
  int64_t max_items;
  uint64_t total_bytes;  // of the whole layout, as expert_segment_layout computes it
  int32_t worker_pid;    // written by the worker before it sets worker_ready
  // 0 until the worker has attached and can serve; also a futex word the coordinator sleeps on.
  std::atomic<uint32_t> worker_ready;
};
static_assert(std::is_standard_layout_v<ExpertSegmentHeader>);

struct ExpertDims {
  int64_t n_embd = 0;
  int64_t max_tokens = 0;
  int64_t max_items = 0;
};

// Byte offsets of each part from the start of the segment.
struct ExpertSegmentLayout {
  size_t request_ring = 0, response_ring = 0, x = 0, items = 0, out = 0, total = 0;
};

// Throws moe::Error when a size is out of range.
ExpertSegmentLayout expert_segment_layout(const ExpertDims& dims);

// A validated view of a segment. Sizes are private copies: a peer rewriting the header later
// cannot make either side index out of bounds.
struct ExpertSegment {
  ExpertSegmentHeader* header;
  SpscRing requests;   // coordinator -> worker
  SpscRing responses;  // worker -> coordinator
  float* x;            // [max_tokens, n_embd]
  ExpertWorkItem* items;
  float* out;  // [max_tokens, n_embd]
  ExpertDims dims;
};

// Coordinator side: lays out an empty segment at `mem` (page-aligned, `bytes` long, nobody
// attached yet). Throws moe::Error when it does not fit.
ExpertSegment format_expert_segment(void* mem, size_t bytes, const ExpertDims& dims);

// Worker side: checks magic, version, sizes and both rings; throws moe::Error naming the bad
// field.
ExpertSegment attach_expert_segment(void* mem, size_t bytes);

}  // namespace moe::shm
