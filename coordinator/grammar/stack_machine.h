// The matcher's pushdown automaton, determinized lazily (internal to coordinator/grammar).
//
// A parse stack is a chain of nodes (position in GrammarImpl::elements, parent node), interned so
// that equal stacks are one id and advancing shares the untouched part of the stack. Node 0 is
// the empty stack: the root rule is complete. A stack's top is always a character class (or it is
// node 0); rule references and completed rules are expanded away as the stack is made.
//
// A state is a sorted, deduplicated set of stacks plus the bytes of a UTF-8 character not yet
// complete; states are interned too, so one id is the canonical parser state (the mask cache's
// key). step(state, byte) is memoized per state: after a few tokens, walking the vocabulary's
// prefix tree costs about one table lookup per tree node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/grammar/grammar.h"
#include "coordinator/grammar/grammar_impl.h"

namespace moe::grammar {

// Bytes in 64 groups for skipping whole subtrees of the vocabulary's prefix tree: ASCII in pairs
// (0x7C..0x7F share group 62) and every byte of a multi-byte character in group 63. A walk takes a
// subtree whole, without stepping into it, when its state steps to itself on every byte of the
// groups below (the inside of a JSON string).
inline uint64_t byte_group(uint8_t b) { return 1ull << (b >= 0x80 ? 63 : b >= 0x7C ? 62 : b >> 1); }
inline constexpr uint64_t kMultiByteGroup = 1ull << 63;

class StackMachine {
 public:
  static constexpr int32_t kDead = -1;

  explicit StackMachine(const Grammar& g);

  // The state before any input: the root's alternatives expanded.
  int32_t initial() const { return initial_; }

  // The state after one more byte, or kDead. Throws moe::Error when the grammar is too
  // ambiguous (more than max_stacks stacks) or the machine grows past its state bound.
  int32_t step(int32_t s, uint8_t byte) {
    const Trans& t = trans_[static_cast<size_t>(s)];
    if (t.dense >= 0) {
      const int32_t next = dense_[static_cast<size_t>(t.dense) * 256 + byte];
      if (next != kUnknown) return next;
    } else {
      for (uint8_t i = 0; i < t.n; ++i) {
        if (t.byte[i] == byte) return t.next[i];
      }
    }
    return step_slow(s, byte);
  }

  // The byte groups (byte_group) whose every byte steps `s` to itself; group 63 when every
  // multi-byte character does. Found only for hot states (with a dense step table), else 0.
  uint64_t loop_groups(int32_t s) {
    const auto i = static_cast<size_t>(s);
    if (i < loops_.size() && loops_known_[i]) return loops_[i];
    // Finding them costs 130 steps: worth it only for states many tree nodes reach.
    if (trans_[i].dense < 0 || ++trans_[i].loop_asks < kLoopAsks) return 0;
    return find_loop_groups(s);
  }

  bool pending(int32_t s) const {
    const State& st = states_[static_cast<size_t>(s)];
    return st.pending_len != 0 || st.left != 0;
  }

  bool can_end(int32_t s) const {
    const State& st = states_[static_cast<size_t>(s)];
    return st.pending_len == 0 && st.left == 0 && st.size > 0 && pool_[st.begin] == 0;
  }
  bool must_end(int32_t s) const {
    const State& st = states_[static_cast<size_t>(s)];
    return st.pending_len == 0 && st.left == 0 && st.size == 1 && pool_[st.begin] == 0;
  }

  // Grown past the size at which the owner should rebuild it between tokens (rebuild_into).
  bool oversized() const;
  // A fresh machine holding only `s` (re-interned); its id in the new machine is returned.
  int32_t rebuild_into(StackMachine& fresh, int32_t s) const;

  size_t n_states() const { return states_.size(); }

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr uint8_t kLoopAsks = 32;

  struct Node {
    uint32_t pos;     // element index; for node 0 unused
    uint32_t parent;  // node to continue with when this rule completes
  };
  // The bytes of a character not yet complete are kept as they are, or, where every stack's class
  // holds all or none of the code points the character can still become and the remaining bytes
  // are free, only as how many are `left` (and one such code point): then the thousands of CJK
  // characters a vocabulary holds share three states instead of one per byte prefix.
  struct State {
    uint32_t begin = 0, size = 0;  // the stacks: pool_[begin, begin + size), sorted
    uint8_t pending_len = 0;
    uint8_t pending[3] = {};
    uint8_t left = 0;  // collapsed: continuation bytes still to come (pending_len is 0)
    char32_t rep = 0;  // collapsed: a code point the character can become
    uint64_t sig = 0;  // collapsed: which stacks it matches (part of the identity)
  };
  struct Trans {  // memoized step(): four inline entries, then a dense table
    int32_t dense = -1;
    uint8_t n = 0;
    uint8_t loop_asks = 0;  // loop_groups() calls before the loops are known
    uint8_t byte[4] = {};
    int32_t next[4] = {};
  };

  uint64_t find_loop_groups(int32_t s);
  int32_t step_slow(int32_t s, uint8_t byte);
  void remember(int32_t s, uint8_t byte, int32_t next);
  uint32_t node(uint32_t pos, uint32_t parent);
  void expand(uint32_t n);
  // stacks of `s` advanced by code point cp, into scratch_ (sorted, deduplicated).
  void advance(int32_t s, char32_t cp);
  int32_t intern(std::span<const uint32_t> stacks, const State& proto);
  int32_t complete(int32_t s, char32_t cp);
  int32_t partial(int32_t s, const uint8_t* pend, uint8_t len, int need);
  void new_round();
  [[noreturn]] void too_ambiguous(const char* what) const;

  const GrammarImpl& g_;
  size_t max_stacks_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> node_ids_;
  std::vector<uint32_t> mark_;  // per node: the expansion round that last visited it
  uint32_t round_ = 0;
  size_t budget_ = 0;  // nodes one round may still expand
  std::vector<uint32_t> work_, scratch_;

  std::vector<State> states_;
  std::vector<Trans> trans_;
  std::vector<uint32_t> pool_;
  std::vector<int32_t> dense_;
  std::vector<uint64_t> loops_;  // per state: loop_groups, where loops_known_
  std::vector<uint8_t> loops_known_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::string key_;
  int32_t initial_ = 0;
};

}  // namespace moe::grammar
