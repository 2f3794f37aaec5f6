// The prefix tree of a vocabulary's token bytes (internal to coordinator/grammar), in preorder in
// one array: a mask walk is a linear scan that skips a dead subtree by jumping to its end.
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/grammar/grammar.h"
#include "coordinator/grammar/stack_machine.h"

namespace moe::grammar {

struct TokenBytes::Trie {
  struct Node {
    uint64_t below;       // byte_group() of every byte below this node (0: a leaf)
    uint32_t end;         // one past the last node of this subtree
    uint32_t tok_begin;   // tokens ending here: tokens[tok_begin, next node's tok_begin)
    uint16_t depth;       // root: 0
    uint8_t byte;         // the edge from the parent
    bool bad_utf8_below;  // some path below is not UTF-8 (read from the root)
  };
  std::vector<Node> nodes;      // nodes[0]: the root; a sentinel after the last node
  std::vector<int32_t> tokens;  // Text tokens with bytes, grouped by node
  std::vector<int32_t> eog;     // Eog tokens
  uint16_t max_depth = 0;
};

}  // namespace moe::grammar
