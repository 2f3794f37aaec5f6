#include "experts/expert_protocol.h"

#include <limits>
#include <new>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"

namespace moe::shm {
namespace {

std::string segment_error(const std::string& what) { return "expert segment: " + what; }

void check_range(const char* field, int64_t v, int64_t max) {
  if (v < 1 || v > max) {
    throw Error(segment_error(std::string(field) + " " + std::to_string(v) + " is not in [1, " +
                              std::to_string(max) + "]"));
  }
}

// Appends `bytes` at the next 64-byte boundary; returns the part's offset.
uint64_t place(uint64_t& cursor, uint64_t bytes) {
  const auto start = checked_align_up(cursor, kCacheLine);
  const auto end = start ? checked_add(*start, bytes) : std::nullopt;
  if (!end) throw Error(segment_error("size overflows"));
  cursor = *end;
  return *start;
}

uint64_t mul(uint64_t a, uint64_t b) {
  const auto r = checked_mul(a, b);
  if (!r) throw Error(segment_error("size overflows"));
  return *r;
}

ExpertSegment view(void* mem, const ExpertSegmentLayout& l, const ExpertDims& dims,
                   const SpscRing& requests, const SpscRing& responses) {
  auto* base = static_cast<std::byte*>(mem);
  return ExpertSegment{static_cast<ExpertSegmentHeader*>(mem),
                       requests,
                       responses,
                       reinterpret_cast<float*>(base + l.x),
                       reinterpret_cast<ExpertWorkItem*>(base + l.items),
                       reinterpret_cast<float*>(base + l.out),
                       dims};
}

}  // namespace

ExpertSegmentLayout expert_segment_layout(const ExpertDims& d) {
  check_range("n_embd", d.n_embd, kExpertMaxEmbd);
  check_range("max_tokens", d.max_tokens, kExpertMaxTokens);
  check_range("max_items", d.max_items, kExpertMaxItems);
  const uint64_t rows = mul(static_cast<uint64_t>(d.max_tokens), static_cast<uint64_t>(d.n_embd));
  uint64_t cursor = sizeof(ExpertSegmentHeader);
  ExpertSegmentLayout l;
  l.request_ring =
      place(cursor, SpscRing::required_bytes(kExpertRingCapacity, sizeof(ExpertRequest)));
  l.response_ring =
      place(cursor, SpscRing::required_bytes(kExpertRingCapacity, sizeof(ExpertResponse)));
  l.x = place(cursor, mul(rows, sizeof(float)));
  l.items = place(cursor, mul(static_cast<uint64_t>(d.max_items), sizeof(ExpertWorkItem)));
  l.out = place(cursor, mul(rows, sizeof(float)));
  const auto total = checked_align_up(cursor, kCacheLine);
  if (!total || *total > std::numeric_limits<size_t>::max()) {
    throw Error(segment_error("size overflows"));
  }
  l.total = static_cast<size_t>(*total);
  return l;
}

ExpertSegment format_expert_segment(void* mem, size_t bytes, const ExpertDims& dims) {
  const ExpertSegmentLayout l = expert_segment_layout(dims);
  if (mem == nullptr || reinterpret_cast<uintptr_t>(mem) % kCacheLine != 0 || bytes < l.total) {
    throw Error(segment_error("needs " + std::to_string(l.total) +
                              " bytes of 64-byte-aligned memory, got " + std::to_string(bytes)));
  }
  auto* base = static_cast<std::byte*>(mem);
  const SpscRing req = SpscRing::format(base + l.request_ring, l.response_ring - l.request_ring,
                                        kExpertRingCapacity, sizeof(ExpertRequest));
  const SpscRing resp = SpscRing::format(base + l.response_ring, l.x - l.response_ring,
                                         kExpertRingCapacity, sizeof(ExpertResponse));
  // Placement-new starts the atomics' lifetimes; the magic is published last, so a worker that
  // attaches early sees "bad magic", never a half-written header.
  auto* h = new (mem) ExpertSegmentHeader{};
  h->version = kExpertVersion;
  h->n_embd = dims.n_embd;
  h->max_tokens = dims.max_tokens;
  h->max_items = dims.max_items;
  h->total_bytes = l.total;
  h->magic.store(kExpertMagic, std::memory_order_release);
  return view(mem, l, dims, req, resp);
}

ExpertSegment attach_expert_segment(void* mem, size_t bytes) {
  if (mem == nullptr || reinterpret_cast<uintptr_t>(mem) % kCacheLine != 0 ||
      bytes < sizeof(ExpertSegmentHeader)) {
    throw Error(segment_error(std::to_string(bytes) + " bytes cannot hold the header"));
  }
  auto* h = static_cast<ExpertSegmentHeader*>(mem);
  if (h->magic.load(std::memory_order_acquire) != kExpertMagic) {
    throw Error(segment_error("bad magic (not an expert segment, or not formatted yet)"));
  }
  if (h->version != kExpertVersion) {
    throw Error(segment_error("version " + std::to_string(h->version) + ", expected " +
                              std::to_string(kExpertVersion)));
  }
  const ExpertDims dims{h->n_embd, h->max_tokens, h->max_items};
  const ExpertSegmentLayout l = expert_segment_layout(dims);  // range-checks the sizes
  if (h->total_bytes != l.total || l.total > bytes) {
    throw Error(segment_error("header says " + std::to_string(h->total_bytes) +
                              " bytes, its sizes need " + std::to_string(l.total) +
                              ", the segment has " + std::to_string(bytes)));
  }
  auto* base = static_cast<std::byte*>(mem);
  const SpscRing req = SpscRing::attach(base + l.request_ring, l.response_ring - l.request_ring,
                                        sizeof(ExpertRequest));
  const SpscRing resp =
      SpscRing::attach(base + l.response_ring, l.x - l.response_ring, sizeof(ExpertResponse));
  if (req.capacity() != kExpertRingCapacity || resp.capacity() != kExpertRingCapacity) {
    throw Error(segment_error("ring capacity differs from " + std::to_string(kExpertRingCapacity)));
  }
  return view(mem, l, dims, req, resp);
}

}  // namespace moe::shm
