#include "coordinator/grammar/stack_machine.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"

namespace moe::grammar {
namespace {

// Bounds on one machine's memory. Between tokens a machine past the soft bounds is rebuilt with
// only its current state (memoized steps are a cache); the hard bound stops one mask walk or one
// step from growing without end on a grammar whose states never repeat.
constexpr size_t kSoftStates = 1u << 16, kSoftNodes = 1u << 20, kSoftDense = 1u << 12;
constexpr size_t kHardStates = 1u << 19;

// Length of the UTF-8 sequence a lead byte starts (0: not a lead byte).
int utf8_length(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

}  // namespace

StackMachine::StackMachine(const Grammar& g)
    : g_(g.impl()), max_stacks_(std::max<size_t>(g.limits().max_stacks, 1)) {
  nodes_.push_back({0, 0});  // node 0: the empty stack
  mark_.push_back(0);
  new_round();
  for (uint32_t begin : g_.alt_begin[g_.root]) expand(node(begin, 0));
  std::sort(scratch_.begin(), scratch_.end());
  scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
  if (scratch_.size() > max_stacks_) too_ambiguous("at its start");
  initial_ = intern(scratch_, State{});
}

// One round: one character read from one state (or the start); each node expanded once in it.
void StackMachine::new_round() {
  ++round_;
  scratch_.clear();
  work_.clear();  // a round that threw may have left some
  budget_ = max_stacks_ > (SIZE_MAX >> 4) ? SIZE_MAX : 8 * max_stacks_ + 2 * g_.rule_begin.size();
}

void StackMachine::too_ambiguous(const char* what) const {
  throw moe::Error(std::string("grammar: more than max_stacks (") + std::to_string(max_stacks_) +
                   ") parse stacks " + what + ": the grammar is too ambiguous");
}

uint32_t StackMachine::node(uint32_t pos, uint32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | parent;
  auto [it, fresh] = node_ids_.emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (fresh) {
    nodes_.push_back({pos, parent});
    mark_.push_back(0);
  }
  return it->second;
}

// Adds to scratch_ every stack that `n` stands for with a character class (or nothing: node 0)
// on top: rule references are entered, completed rules return to their parent. An explicit
// worklist (rule chains can be as deep as the grammar has rules) and one visit per node per round
// (ambiguous grammars reach the same node many ways).
void StackMachine::expand(uint32_t n) {
  work_.push_back(n);
  while (!work_.empty()) {
    const uint32_t id = work_.back();
    work_.pop_back();
    if (mark_[id] == round_) continue;
    mark_[id] = round_;
    if (budget_-- == 0) too_ambiguous("while expanding rules");
    if (id == 0) {
      scratch_.push_back(0);
      continue;
    }
    const Node nd = nodes_[id];
    const Element e = g_.elements[nd.pos];
    switch (e.op) {
      case Op::Class:
        scratch_.push_back(id);
        break;
      case Op::End:
      case Op::Alt:
        work_.push_back(nd.parent);
        break;
      case Op::Rule: {
        // A reference at the end of an alternative returns straight to the parent: right
        // recursion (x* became `r ::= x r | ""`) keeps the stack flat.
        const uint32_t ret = nd.pos + 1;
        const uint32_t base = g_.ends_alternative(ret) ? nd.parent : node(ret, nd.parent);
        for (uint32_t begin : g_.alt_begin[e.arg]) work_.push_back(node(begin, base));
        break;
      }
    }
  }
}

void StackMachine::advance(int32_t s, char32_t cp) {
  const State st = states_[static_cast<size_t>(s)];
  new_round();
  for (uint32_t i = 0; i < st.size; ++i) {
    const uint32_t id = pool_[st.begin + i];
    if (id == 0) continue;
    const Node nd = nodes_[id];
    if (g_.classes[g_.elements[nd.pos].arg].matches(cp)) expand(node(nd.pos + 1, nd.parent));
  }
  std::sort(scratch_.begin(), scratch_.end());
  scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
  if (scratch_.size() > max_stacks_) too_ambiguous("after one character");
}

int32_t StackMachine::intern(std::span<const uint32_t> stacks, const State& proto) {
  key_.assign(1, static_cast<char>(proto.pending_len | (proto.left << 2)));
  key_.append(reinterpret_cast<const char*>(proto.pending), proto.pending_len);
  if (proto.left) key_.append(reinterpret_cast<const char*>(&proto.sig), sizeof proto.sig);
  key_.append(reinterpret_cast<const char*>(stacks.data()), stacks.size_bytes());
  auto [it, fresh] = state_ids_.emplace(key_, static_cast<int32_t>(states_.size()));
  if (!fresh) return it->second;
  if (states_.size() >= kHardStates) {
    state_ids_.erase(it);
    throw moe::Error("grammar: more than " + std::to_string(kHardStates) +
                     " parser states for one step: the grammar is too ambiguous");
  }
  State st = proto;
  st.begin = static_cast<uint32_t>(pool_.size());
  st.size = static_cast<uint32_t>(stacks.size());
  pool_.insert(pool_.end(), stacks.begin(), stacks.end());
  states_.push_back(st);
  trans_.emplace_back();
  return it->second;
}

void StackMachine::remember(int32_t s, uint8_t byte, int32_t next) {
  Trans& t = trans_[static_cast<size_t>(s)];
  if (t.dense < 0 && t.n < 4) {
    t.byte[t.n] = byte;
    t.next[t.n++] = next;
    return;
  }
  if (t.dense < 0) {  // a state stepped on many bytes is hot: a table of 256
    t.dense = static_cast<int32_t>(dense_.size() / 256);
    dense_.resize(dense_.size() + 256, kUnknown);
    for (uint8_t i = 0; i < t.n; ++i)
      dense_[static_cast<size_t>(t.dense) * 256 + t.byte[i]] = t.next[i];
  }
  dense_[static_cast<size_t>(t.dense) * 256 + byte] = next;
}

// The state after a whole character: its stacks advanced by cp.
int32_t StackMachine::complete(int32_t s, char32_t cp) {
  advance(s, cp);
  return scratch_.empty() ? kDead : intern(scratch_, State{});
}

// The state after `len` of the `need` bytes of a character (its free continuations to come).
int32_t StackMachine::partial(int32_t s, const uint8_t* pend, uint8_t len, int need) {
  const State st = states_[static_cast<size_t>(s)];
  // The code points it can still become: the rest as 0x80.. and as ..0xBF.
  char32_t lo = pend[0] & (0x7F >> need);
  for (uint8_t i = 1; i < len; ++i) lo = (lo << 6) | (pend[i] & 0x3F);
  char32_t hi = lo;
  for (int i = len; i < need; ++i) lo <<= 6, hi = (hi << 6) | 0x3F;
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  lo = std::max(lo, kMin[need]);
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return kDead;
  // E0, ED, F0 and F4 limit the byte after them (overlong forms, surrogates, past U+10FFFF).
  const bool next_free =
      !(len == 1 && (pend[0] == 0xE0 || pend[0] == 0xED || pend[0] == 0xF0 || pend[0] == 0xF4));
  State proto;
  bool uniform = next_free && st.size <= 64;
  bool any = false;
  for (uint32_t i = 0; i < st.size; ++i) {
    const uint32_t id = pool_[st.begin + i];
    if (id == 0) continue;
    const CharClass& c = g_.classes[g_.elements[nodes_[id].pos].arg];
    if (!c.intersects(lo, hi)) continue;
    any = true;
    if (c.contains(lo, hi)) {
      if (i < 64) proto.sig |= 1ull << i;  // a larger set is never uniform: sig is unused
    } else {
      uniform = false;
    }
  }
  if (!any) return kDead;
  scratch_.assign(pool_.begin() + st.begin, pool_.begin() + st.begin + st.size);
  if (uniform) {
    proto.left = static_cast<uint8_t>(need - len);
    proto.rep = lo;
  } else {
    proto.sig = 0;
    proto.pending_len = len;
    std::memcpy(proto.pending, pend, len);
  }
  return intern(scratch_, proto);
}

int32_t StackMachine::step_slow(int32_t s, uint8_t byte) {
  const State st = states_[static_cast<size_t>(s)];
  int32_t next = kDead;
  const bool continuation = (byte & 0xC0) == 0x80;
  if (st.left > 0) {  // a collapsed character: any continuation byte will do
    if (continuation && st.left == 1) {
      next = complete(s, st.rep);
    } else if (continuation) {
      State proto = st;
      --proto.left;
      scratch_.assign(pool_.begin() + st.begin, pool_.begin() + st.begin + st.size);
      next = intern(scratch_, proto);
    }
  } else if (st.pending_len == 0) {
    const int need = utf8_length(byte);
    if (need == 1) {
      next = complete(s, byte);
    } else if (need > 1) {
      next = partial(s, &byte, 1, need);
    }
  } else if (continuation) {
    uint8_t pend[4];
    std::memcpy(pend, st.pending, st.pending_len);
    pend[st.pending_len] = byte;
    const auto len = static_cast<uint8_t>(st.pending_len + 1);
    const int need = utf8_length(pend[0]);
    const uint8_t b0 = pend[0];
    const bool second_ok =
        len != 2 || ((b0 != 0xE0 || byte >= 0xA0) && (b0 != 0xED || byte <= 0x9F) &&
                     (b0 != 0xF0 || byte >= 0x90) && (b0 != 0xF4 || byte <= 0x8F));
    if (second_ok && len == need) {
      char32_t cp = pend[0] & (0x7F >> need);
      for (uint8_t i = 1; i < len; ++i) cp = (cp << 6) | (pend[i] & 0x3F);
      next = complete(s, cp);
    } else if (second_ok) {
      next = partial(s, pend, len, need);
    }
  }
  remember(s, byte, next);
  return next;
}

uint64_t StackMachine::find_loop_groups(int32_t s) {
  uint64_t groups = 0;
  if (!pending(s)) {
    groups = ~kMultiByteGroup;
    for (uint32_t b = 0; b < 0x80; ++b) {
      if (step(s, static_cast<uint8_t>(b)) != s) groups &= ~byte_group(static_cast<uint8_t>(b));
    }
    // Every multi-byte character leads back to s when each stack's class holds all of them or
    // none (then they all step like U+0080) and U+0080 does.
    const State st = states_[static_cast<size_t>(s)];
    bool uniform = true;
    for (uint32_t i = 0; i < st.size && uniform; ++i) {
      const uint32_t id = pool_[st.begin + i];
      if (id == 0) continue;
      const CharClass& c = g_.classes[g_.elements[nodes_[id].pos].arg];
      uniform = c.contains(0x80, kMaxCodePoint) || !c.intersects(0x80, kMaxCodePoint);
    }
    const int32_t lead = step(s, 0xC2);
    if (uniform && lead != kDead && step(lead, 0x80) == s) groups |= kMultiByteGroup;
  }
  if (loops_.size() < states_.size()) {
    loops_.resize(states_.size(), 0);
    loops_known_.resize(states_.size(), 0);
  }
  loops_[static_cast<size_t>(s)] = groups;
  loops_known_[static_cast<size_t>(s)] = 1;
  return groups;
}

bool StackMachine::oversized() const {
  return states_.size() > kSoftStates || nodes_.size() > kSoftNodes ||
         dense_.size() / 256 > kSoftDense;
}

int32_t StackMachine::rebuild_into(StackMachine& fresh, int32_t s) const {
  const State st = states_[static_cast<size_t>(s)];
  std::vector<uint32_t> stacks;
  std::unordered_map<uint32_t, uint32_t> moved{{0, 0}};
  std::vector<uint32_t> chain;
  for (uint32_t i = 0; i < st.size; ++i) {
    // Re-intern the chain bottom-up: parents first.
    chain.clear();
    for (uint32_t id = pool_[st.begin + i]; !moved.contains(id); id = nodes_[id].parent) {
      chain.push_back(id);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      moved[*it] = fresh.node(nodes_[*it].pos, moved.at(nodes_[*it].parent));
    }
    stacks.push_back(moved.at(pool_[st.begin + i]));
  }
  std::sort(stacks.begin(), stacks.end());
  return fresh.intern(stacks, st);
}

}  // namespace moe::grammar
