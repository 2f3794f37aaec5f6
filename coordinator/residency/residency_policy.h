// Which routed experts of the CPU-homed layers hold the slots of one VRAM pool of whole-expert
// slots: pure bookkeeping (no CUDA, no I/O); ExpertResidency does the copies it asks for. Keys are
// layer * n_expert + expert.
//
// Scores are frequency with recency (LFRU): each routing adds 1 to a key's score, and scores
// halve every half_life_tokens routed tokens, so an expert that was hot long ago gives way to one
// that is hot now, while one that is routed steadily stays. Decay is lazy: each key keeps its
// score at the token clock of its last update, and the effective score at clock c is
//   score * 2^(-(c - stamp) / half_life).
// A miss fetched over PCIe enters the pool only when it displaces a colder expert (admission
// guard): a newcomer routed once must not push out an expert that is routed all the time.
//
// Grouping Off: one pool, any slot holds any CPU-homed layer's expert. Grouping Layout: each
// CPU-homed layer owns a contiguous range of slots, sized by plan() in proportion to the layer's
// score mass, so that a layer's resident experts lie together and a miss of one layer only ever
// evicts an expert of the same layer. Host-only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace moe::model {

enum class Grouping { Off, Layout };

class ResidencyPolicy {
 public:
  // cpu_layer[l]: layer l's experts are CPU-homed and may occupy slots (the others' never do).
  // moe::Error unless there is a layer, n_expert > 0, n_slots >= 0 and half_life_tokens > 0.
  ResidencyPolicy(std::vector<bool> cpu_layer, int64_t n_expert, int64_t n_slots, Grouping g,
                  double half_life_tokens);

  // Every call below that takes a layer, expert or slot throws moe::Error when it is out of range.

  // Advances the token clock: once per forward, with its token count (>= 0).
  void tick(int64_t n_tokens);
  // One routing of (layer, expert): its decayed score + 1. Ignored for GPU-homed layers.
  void touch(int64_t layer, int64_t expert, double weight = 1.0);
  // The effective score now (0 for GPU-homed layers).
  double score(int64_t layer, int64_t expert) const;
  // A saved profile's counts ([n_layer * n_expert], layer-major) as the scores, stamped now;
  // GPU-homed layers' counts are ignored. moe::Error when the size does not match. Residency is
  // unchanged until the next plan().
  void set_scores(const std::vector<uint64_t>& counts);

  int64_t slot_of(int64_t layer, int64_t expert) const;  // -1 when not resident
  int64_t owner(int64_t slot) const;                     // its key, or -1 when empty

  // A slot's new content; key -1: the slot is emptied (nothing to copy).
  struct Assignment {
    int64_t slot;
    int64_t key;
  };
  // Whole re-plan (between forwards; pins are not consulted): under Layout first the ranges
  // (see range()), then each group (the pool, or a layer's range) gets its top-scored keys with a
  // score > 0 (ties: lower layer, then lower expert). Keys that stay keep their slot; the others
  // fill the freed slots in ascending slot order, best first. Returns the slots whose content
  // changes, in ascending slot order, and applies them.
  std::vector<Assignment> plan();

  // A pool of n_slots slots grouped as g instead (a live resize, SetExpertPolicy): every slot
  // starts empty, scores, clock and counters stay, so the next plan() fills it with the hottest
  // keys. moe::Error (nothing changed) when n_slots < 0.
  void reshape(int64_t n_slots, Grouping g);

  // Admission of one miss fetched over PCIe: the slot to copy it into, recorded as resident there
  // (evicting its old owner); its own slot when it is already resident (nothing changes); -1 when
  // it stays out: a GPU-homed layer, no slot in its range (Layout) or pool, every occupied
  // candidate pinned, or the coldest unpinned candidate's score >= its own. A free slot in the
  // range is taken first (at any score); otherwise the victim is the coldest unpinned candidate
  // (ties: the higher layer, then the higher expert, goes). Allocates nothing.
  int64_t admit(int64_t layer, int64_t expert);
  // The slot holding (layer, expert), now or after a later admit(), may not be evicted until
  // unpin_all() (one layer visit: pin the visit's experts before admitting its misses).
  void pin(int64_t layer, int64_t expert);
  void unpin_all();

  int64_t n_slots() const { return n_slots_; }
  int64_t filled() const { return filled_; }
  Grouping grouping() const { return grouping_; }
  int64_t n_layer() const { return n_layer_; }
  int64_t n_expert() const { return n_expert_; }
  int64_t clock() const { return clock_; }
  // (first, count) of a layer's slots under Layout ((first, 0) for a GPU-homed layer); (0,
  // n_slots) under Off. Before the first plan() the CPU-homed layers split the slots evenly (the
  // remainder to the lowest layers); plan() sizes them by score mass with largest-remainder
  // rounding, in ascending layer order, contiguous, summing to n_slots. A layer never gets more
  // than n_expert slots while another has room (the excess goes to the others by their mass).
  std::pair<int64_t, int64_t> range(int64_t layer) const;
  // Since construction, by admit() only: keys placed, and resident keys displaced by them.
  int64_t evictions() const { return evictions_; }
  int64_t admissions() const { return admissions_; }

 private:
  int64_t key(int64_t layer, int64_t expert) const;  // checked
  double effective(int64_t k) const;
  void set_score(int64_t k, double s);  // stamped now
  void rebase();
  void split_evenly();
  void split_by_mass(const std::vector<double>& eff);

  std::vector<bool> cpu_layer_;
  int64_t n_layer_, n_expert_, n_slots_;
  Grouping grouping_;
  double half_life_;

  int64_t clock_ = 0;
  // Per key: the score at its stamp, and that score carried to anchor_ (score * 2^((stamp -
  // anchor) / half_life)); the latter orders keys the same way as their effective scores at any
  // clock, so admit() compares slots without an exp2 each. anchor_ follows the clock.
  std::vector<double> score_;
  std::vector<int64_t> stamp_;
  std::vector<double> anchored_;
  int64_t anchor_ = 0;

  std::vector<int64_t> slot_of_;                    // per key
  std::vector<int64_t> owner_;                      // per slot
  std::vector<std::pair<int64_t, int64_t>> range_;  // per layer, Layout
  std::vector<char> pinned_;                        // per key
  std::vector<int64_t> pinned_keys_;                // reserved for every key: pin() never allocates
  int64_t filled_ = 0, evictions_ = 0, admissions_ = 0;
};

}  // namespace moe::model
