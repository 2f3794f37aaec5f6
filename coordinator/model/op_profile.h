// Where a CPU forward's time goes, op by op (moe-bench --op-profile): wall time of each op on the
// forward's thread (a pooled op counts until its last task ends), the weight bytes its products
// read, and the tokens it served, so a table shows time per token and read bandwidth per op, and
// which op stops scaling as threads are added.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

#include "kernels/cpu/matmul.h"

namespace moe::model {

enum class Op : int {
  kEmbed,
  kNorm,           // the layers' RMSNorms (attention, post-attention / FFN, q/k heads)
  kAttnProj,       // q, k, v projections
  kRopeStore,      // RoPE and the K/V cache store
  kAttention,      // softmax(q·K)·V over the cache
  kAttnOut,        // output gate and projection
  kSsmProj,        // DeltaNet input projections and their gates
  kSsmConv,        // causal conv and the q/k L2 norms
  kSsmDelta,       // the gated DeltaNet recurrence
  kSsmOut,         // gated norm and output projection
  kRoutedExperts,  // router, top-k and the routed experts (RoutedMoeCpu)
  kSharedExpert,   // qwen35moe's shared expert and its gate
  kResidual,       // residual adds
  kOutput,         // final norm and the output head
  kCount
};

const char* op_name(Op op);

// Bytes of a weight matrix, read once per product.
inline uint64_t weight_bytes(const cpu::WeightMatrix& w) {
  return static_cast<uint64_t>(w.row_bytes) * static_cast<uint64_t>(w.n_out);
}

class OpProfile {
 public:
  // Only an active profile counts (moe-bench turns it on around the timed forwards).
  void set_active(bool on) { active_ = on; }
  bool active() const { return active_; }
  void add(Op op, double us, uint64_t bytes);
  void count_tokens(int64_t n) { tokens_ += n; }
  void reset();
  uint64_t calls(Op op) const { return entries_[static_cast<size_t>(op)].calls; }
  uint64_t bytes(Op op) const { return entries_[static_cast<size_t>(op)].bytes; }
  int64_t tokens() const { return tokens_; }
  // A markdown table: op, calls, ms per token, share of the profiled time, weight GB/s.
  std::string table() const;

 private:
  struct Entry {
    double us = 0;
    uint64_t bytes = 0, calls = 0;
  };
  std::array<Entry, static_cast<size_t>(Op::kCount)> entries_{};
  int64_t tokens_ = 0;
  bool active_ = false;
};

// Times its scope into `profile` (nothing when it is null or inactive).
class OpTimer {
 public:
  OpTimer(OpProfile* profile, Op op, uint64_t bytes = 0)
      : profile_(profile && profile->active() ? profile : nullptr), op_(op), bytes_(bytes) {
    if (profile_) t0_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (profile_) {
      const auto dt = std::chrono::steady_clock::now() - t0_;
      profile_->add(op_, std::chrono::duration<double, std::micro>(dt).count(), bytes_);
    }
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpProfile* profile_;
  Op op_;
  uint64_t bytes_;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace moe::model
