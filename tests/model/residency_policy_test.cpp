// ResidencyPolicy: scores decay with a half-life in tokens; plan() places the top-scored keys of
// the CPU-homed layers, keeps resident ones in place and returns only the changes; Layout ranges
// follow each layer's score mass; admit() takes a free slot, else displaces only a colder,
// unpinned expert of its pool or range; bad arguments throw; a random mix of calls keeps the
// slot tables consistent.
#include "coordinator/residency/residency_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"

namespace {

using moe::model::Grouping;
using moe::model::ResidencyPolicy;

// Counts for set_scores: {layer, expert, count} triples, the rest 0.
struct Count {
  int64_t layer, expert;
  uint64_t count;
};
std::vector<uint64_t> counts(int64_t n_layer, int64_t n_expert, std::initializer_list<Count> c) {
  std::vector<uint64_t> v(n_layer * n_expert, 0);
  for (const Count& x : c) v[x.layer * n_expert + x.expert] = x.count;
  return v;
}

// Every slot's key (-1: empty), from owner().
std::vector<int64_t> owners(const ResidencyPolicy& p) {
  std::vector<int64_t> o(p.n_slots());
  for (int64_t s = 0; s < p.n_slots(); ++s) o[s] = p.owner(s);
  return o;
}

// A prefill batch's routings count with a weight (1/n per token of an n-token batch).
TEST(ResidencyPolicy, WeightedTouchesAddTheirWeight) {
  ResidencyPolicy p({true}, 4, 2, Grouping::Off, 100);
  p.touch(0, 1, 0.25);
  p.touch(0, 1, 0.25);
  EXPECT_DOUBLE_EQ(p.score(0, 1), 0.5);
  p.touch(0, 2);
  EXPECT_GT(p.score(0, 2), p.score(0, 1));
  EXPECT_THROW(p.touch(0, 1, 0.0), moe::Error);
  EXPECT_THROW(p.touch(0, 1, -1.0), moe::Error);
  EXPECT_THROW(p.touch(0, 1, std::nan("")), moe::Error);
  EXPECT_DOUBLE_EQ(p.score(0, 1), 0.5);  // refused touches change nothing
}

TEST(ResidencyPolicy, ScoreHalvesEveryHalfLife) {
  ResidencyPolicy p({true, false}, 4, 2, Grouping::Off, 100);
  EXPECT_EQ(p.score(0, 1), 0.0);
  p.touch(0, 1);
  EXPECT_DOUBLE_EQ(p.score(0, 1), 1.0);
  p.tick(100);
  EXPECT_DOUBLE_EQ(p.score(0, 1), 0.5);
  p.tick(40);
  p.tick(60);  // in pieces: the same
  EXPECT_DOUBLE_EQ(p.score(0, 1), 0.25);
  p.tick(50);
  EXPECT_NEAR(p.score(0, 1), 0.25 / std::sqrt(2.0), 1e-12);
  p.touch(0, 1);  // the decayed score + 1
  EXPECT_NEAR(p.score(0, 1), 1 + 0.25 / std::sqrt(2.0), 1e-12);
  p.tick(0);
  EXPECT_NEAR(p.score(0, 1), 1 + 0.25 / std::sqrt(2.0), 1e-12);
  EXPECT_EQ(p.score(0, 0), 0.0);
  p.touch(1, 2);  // GPU-homed: ignored
  EXPECT_EQ(p.score(1, 2), 0.0);
  // Saved counts are scores stamped now, and decay from there.
  p.set_scores(counts(2, 4, {{0, 3, 8}, {1, 0, 5}}));
  EXPECT_DOUBLE_EQ(p.score(0, 3), 8.0);
  EXPECT_EQ(p.score(0, 1), 0.0);
  EXPECT_EQ(p.score(1, 0), 0.0);  // GPU-homed counts are ignored
  p.tick(300);
  EXPECT_DOUBLE_EQ(p.score(0, 3), 1.0);
}

TEST(ResidencyPolicy, ScoresStayRightOverManyHalfLives) {
  // Far more than 64 half-lives: the internal re-basing must not change scores or the order.
  ResidencyPolicy p({true}, 4, 1, Grouping::Off, 1);
  for (int i = 0; i < 1000; ++i) p.touch(0, 0);
  ASSERT_EQ(p.admit(0, 0), 0);
  for (int i = 0; i < 30; ++i) p.tick(7);
  EXPECT_NEAR(p.score(0, 0), 1000 * std::exp2(-210.0), 1e-70);
  EXPECT_EQ(p.admit(0, 1), -1);  // score 0: not hotter
  p.touch(0, 1);
  EXPECT_EQ(p.admit(0, 1), 0);  // 1 > 1000 * 2^-210
  EXPECT_EQ(p.slot_of(0, 0), -1);
  p.tick(1);
  p.touch(0, 2);
  p.touch(0, 2);
  p.tick(1);  // (0, 1): 0.25, (0, 2): 1
  EXPECT_DOUBLE_EQ(p.score(0, 1), 0.25);
  EXPECT_DOUBLE_EQ(p.score(0, 2), 1.0);
  EXPECT_EQ(p.admit(0, 2), 0);
}

TEST(ResidencyPolicy, PlanPlacesTheTopKeysAndKeepsResidentOnesInPlace) {
  ResidencyPolicy p({true, true}, 4, 3, Grouping::Off, 4096);
  p.set_scores(counts(2, 4, {{0, 0, 2}, {0, 2, 9}, {1, 1, 7}, {1, 3, 5}, {1, 0, 1}}));
  auto changes = p.plan();
  // Best first into ascending slots: (0,2)=9, (1,1)=7, (1,3)=5.
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].slot, 0);
  EXPECT_EQ(changes[0].key, 0 * 4 + 2);
  EXPECT_EQ(changes[1].slot, 1);
  EXPECT_EQ(changes[1].key, 1 * 4 + 1);
  EXPECT_EQ(changes[2].slot, 2);
  EXPECT_EQ(changes[2].key, 1 * 4 + 3);
  EXPECT_EQ(p.filled(), 3);
  EXPECT_EQ(p.slot_of(1, 1), 1);
  EXPECT_EQ(p.slot_of(0, 0), -1);
  EXPECT_TRUE(p.plan().empty());  // nothing changed

  // (0,0) becomes the hottest and (1,1) drops out: only (1,1)'s slot changes.
  p.set_scores(counts(2, 4, {{0, 0, 20}, {0, 2, 9}, {1, 1, 1}, {1, 3, 5}, {1, 0, 2}}));
  changes = p.plan();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].slot, 1);
  EXPECT_EQ(changes[0].key, 0);
  EXPECT_EQ(p.slot_of(0, 2), 0);
  EXPECT_EQ(p.slot_of(1, 3), 2);
  EXPECT_EQ(p.slot_of(1, 1), -1);
  EXPECT_EQ(p.owner(1), 0);

  // Only keys with a score > 0 are placed: slots left without one are emptied (key -1).
  p.set_scores(counts(2, 4, {{1, 3, 4}}));
  changes = p.plan();
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].slot, 0);
  EXPECT_EQ(changes[0].key, -1);
  EXPECT_EQ(changes[1].slot, 1);
  EXPECT_EQ(changes[1].key, -1);
  EXPECT_EQ(p.filled(), 1);
  EXPECT_EQ(p.owner(2), 1 * 4 + 3);
  EXPECT_EQ(p.admissions(), 0);  // plan() does not count as admissions
  EXPECT_EQ(p.evictions(), 0);
}

TEST(ResidencyPolicy, ReshapeEmptiesTheSlotsAndKeepsTheScores) {
  ResidencyPolicy p({true, true}, 4, 3, Grouping::Off, 4096);
  p.set_scores(counts(2, 4, {{0, 0, 2}, {0, 2, 9}, {1, 1, 7}, {1, 3, 5}, {1, 0, 1}}));
  p.plan();
  ASSERT_EQ(p.filled(), 3);
  ASSERT_EQ(p.admit(0, 0), -1);  // colder than every resident key: stays out
  EXPECT_THROW(p.reshape(-1, Grouping::Layout), moe::Error);
  EXPECT_EQ(p.n_slots(), 3);  // unchanged by the refusal
  EXPECT_EQ(p.filled(), 3);

  // Larger, grouped by layer: empty until planned, then each layer's range holds its hottest.
  p.reshape(4, Grouping::Layout);
  EXPECT_EQ(p.n_slots(), 4);
  EXPECT_EQ(p.grouping(), Grouping::Layout);
  EXPECT_EQ(p.filled(), 0);
  EXPECT_EQ(owners(p), (std::vector<int64_t>{-1, -1, -1, -1}));
  EXPECT_EQ(p.slot_of(0, 2), -1);
  EXPECT_EQ(p.range(0), (std::pair<int64_t, int64_t>{0, 2}));  // split evenly before a plan
  const auto changes = p.plan();
  EXPECT_EQ(changes.size(), 4u);
  EXPECT_EQ(p.filled(), 4);
  // Layer 0's mass 11, layer 1's 13: two slots each; the top two of each layer.
  EXPECT_GE(p.slot_of(0, 2), 0);
  EXPECT_GE(p.slot_of(0, 0), 0);
  EXPECT_GE(p.slot_of(1, 1), 0);
  EXPECT_GE(p.slot_of(1, 3), 0);
  EXPECT_EQ(p.score(0, 2), 9);  // the scores survived

  // Smaller, one pool again: the hottest key only.
  p.reshape(1, Grouping::Off);
  p.plan();
  EXPECT_EQ(owners(p), (std::vector<int64_t>{0 * 4 + 2}));
  // No pool: nothing to place, nothing admitted.
  p.reshape(0, Grouping::Off);
  EXPECT_TRUE(p.plan().empty());
  EXPECT_EQ(p.admit(1, 1), -1);
  EXPECT_EQ(p.filled(), 0);
}

TEST(ResidencyPolicy, TiesGoToTheLowerLayerThenTheLowerExpert) {
  ResidencyPolicy p({true, true, true}, 4, 3, Grouping::Off, 4096);
  p.set_scores(counts(3, 4, {{2, 0, 5}, {1, 3, 5}, {1, 2, 5}, {0, 3, 5}, {0, 0, 1}}));
  p.plan();
  EXPECT_EQ(p.owner(0), 0 * 4 + 3);
  EXPECT_EQ(p.owner(1), 1 * 4 + 2);
  EXPECT_EQ(p.owner(2), 1 * 4 + 3);
  EXPECT_EQ(p.slot_of(2, 0), -1);

  // admit(): on a tie between candidates, the one that ranks lower (higher layer, then higher
  // expert) goes.
  p.set_scores(counts(3, 4, {{2, 0, 6}, {1, 3, 5}, {1, 2, 5}, {0, 3, 5}}));
  EXPECT_EQ(p.admit(2, 0), 2);  // evicts (1,3), not (1,2) or (0,3)
  EXPECT_EQ(p.slot_of(1, 3), -1);
  EXPECT_EQ(p.slot_of(1, 2), 1);
  EXPECT_EQ(p.slot_of(0, 3), 0);
}

TEST(ResidencyPolicy, GpuHomedLayersAreNeverPlaced) {
  for (Grouping g : {Grouping::Off, Grouping::Layout}) {
    ResidencyPolicy p({false, true, false}, 4, 4, g, 4096);
    p.set_scores(counts(3, 4, {{0, 0, 100}, {0, 1, 90}, {1, 2, 3}, {2, 3, 80}}));
    p.touch(0, 2);
    p.touch(2, 2);
    p.plan();
    EXPECT_EQ(p.filled(), 1);
    EXPECT_EQ(p.slot_of(1, 2), 0);
    for (int64_t e = 0; e < 4; ++e) {
      EXPECT_EQ(p.slot_of(0, e), -1);
      EXPECT_EQ(p.slot_of(2, e), -1);
      EXPECT_EQ(p.score(0, e), 0.0);
    }
    EXPECT_EQ(p.admit(0, 0), -1);  // free slots exist, but not for GPU-homed layers
    EXPECT_EQ(p.admit(2, 3), -1);
    EXPECT_EQ(p.filled(), 1);
    if (g == Grouping::Layout) {
      EXPECT_EQ(p.range(0).second, 0);
      EXPECT_EQ(p.range(2).second, 0);
      EXPECT_EQ(p.range(1), std::make_pair(int64_t{0}, int64_t{4}));
    }
  }
}

TEST(ResidencyPolicy, LayoutRangesFollowScoreMass) {
  // Before any plan(): the CPU-homed layers split the slots evenly, the remainder to the lowest.
  ResidencyPolicy p({true, false, true, true}, 8, 10, Grouping::Layout, 4096);
  EXPECT_EQ(p.range(0), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(p.range(1).second, 0);
  EXPECT_EQ(p.range(2), std::make_pair(int64_t{4}, int64_t{3}));
  EXPECT_EQ(p.range(3), std::make_pair(int64_t{7}, int64_t{3}));

  // Masses 6 : 3 : 1 over 10 slots (spread over several experts; the GPU-homed layer's counts
  // do not count).
  p.set_scores(counts(4, 8, {{0, 0, 3}, {0, 5, 3}, {1, 1, 50}, {2, 2, 1}, {2, 7, 2}, {3, 4, 1}}));
  p.plan();
  EXPECT_EQ(p.range(0), std::make_pair(int64_t{0}, int64_t{6}));
  EXPECT_EQ(p.range(1).second, 0);
  EXPECT_EQ(p.range(2), std::make_pair(int64_t{6}, int64_t{3}));
  EXPECT_EQ(p.range(3), std::make_pair(int64_t{9}, int64_t{1}));
  for (int64_t l : {0, 2, 3}) {
    for (int64_t e = 0; e < 8; ++e) {
      const int64_t s = p.slot_of(l, e);
      if (s < 0) continue;
      EXPECT_GE(s, p.range(l).first);
      EXPECT_LT(s, p.range(l).first + p.range(l).second);
    }
  }

  // Largest remainder: masses 5 : 3 : 2 over 7 slots are shares 3.5, 2.1, 1.4 -> 4, 2, 1.
  p.set_scores(counts(4, 8, {{0, 1, 5}, {2, 0, 3}, {3, 3, 2}}));
  p.plan();
  EXPECT_EQ(p.range(0).second + p.range(2).second + p.range(3).second, 10);
  ResidencyPolicy q({true, true, true}, 8, 7, Grouping::Layout, 4096);
  q.set_scores(counts(3, 8, {{0, 1, 5}, {1, 0, 3}, {2, 3, 2}}));
  q.plan();
  EXPECT_EQ(q.range(0), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(q.range(1), std::make_pair(int64_t{4}, int64_t{2}));
  EXPECT_EQ(q.range(2), std::make_pair(int64_t{6}, int64_t{1}));
  // Equal remainders go to the lower layer; a layer without mass gets no slot.
  ResidencyPolicy r({true, true, true, true}, 8, 8, Grouping::Layout, 4096);
  r.set_scores(counts(4, 8, {{0, 0, 1}, {1, 0, 1}, {3, 0, 1}}));
  r.plan();
  EXPECT_EQ(r.range(0), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(r.range(1), std::make_pair(int64_t{3}, int64_t{3}));
  EXPECT_EQ(r.range(2), std::make_pair(int64_t{6}, int64_t{0}));
  EXPECT_EQ(r.range(3), std::make_pair(int64_t{6}, int64_t{2}));
  // No layer gets more slots than it has experts while another has room: masses 10 : 1 : 1
  // over 9 slots with 4 experts are 4 (capped), then 5 shared 1 : 1 -> 3, 2.
  ResidencyPolicy c({true, true, true}, 4, 9, Grouping::Layout, 4096);
  c.set_scores(counts(3, 4, {{0, 0, 4}, {0, 1, 3}, {0, 2, 2}, {0, 3, 1}, {1, 2, 1}, {2, 1, 1}}));
  c.plan();
  EXPECT_EQ(c.range(0), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(c.range(1), std::make_pair(int64_t{4}, int64_t{3}));
  EXPECT_EQ(c.range(2), std::make_pair(int64_t{7}, int64_t{2}));
  EXPECT_EQ(c.filled(), 6);
}

TEST(ResidencyPolicy, LayoutAdmitEvictsOnlyWithinTheLayersRange) {
  ResidencyPolicy p({true, true}, 4, 4, Grouping::Layout, 4096);
  // Equal masses: 2 slots each. Layer 1's residents are the coldest keys of all.
  p.set_scores(counts(2, 4, {{0, 0, 10}, {0, 1, 6}, {1, 0, 15}, {1, 1, 1}}));
  p.plan();
  ASSERT_EQ(p.range(0), std::make_pair(int64_t{0}, int64_t{2}));
  ASSERT_EQ(p.range(1), std::make_pair(int64_t{2}, int64_t{2}));
  ASSERT_EQ(p.filled(), 4);
  for (int i = 0; i < 7; ++i) p.touch(0, 3);  // 7 > 6
  const int64_t s = p.admit(0, 3);
  EXPECT_EQ(s, 1);  // (0,1)'s slot, not (1,1)'s though (1,1) is colder
  EXPECT_EQ(p.slot_of(0, 1), -1);
  EXPECT_EQ(p.slot_of(1, 1), 3);
  EXPECT_EQ(p.owner(1), 3);
  EXPECT_EQ(p.evictions(), 1);
  EXPECT_EQ(p.admissions(), 1);
  // 7 is not hotter than layer 0's coldest now (7 itself): refused, though layer 1 holds a 1.
  for (int i = 0; i < 7; ++i) p.touch(0, 2);
  EXPECT_EQ(p.admit(0, 2), -1);
  EXPECT_EQ(p.slot_of(1, 1), 3);
}

TEST(ResidencyPolicy, OffAdmitEvictsTheGloballyColdest) {
  ResidencyPolicy p({true, true, true}, 4, 3, Grouping::Off, 4096);
  p.set_scores(counts(3, 4, {{0, 0, 10}, {1, 1, 3}, {2, 2, 8}}));
  p.plan();
  ASSERT_EQ(p.filled(), 3);
  const int64_t cold_slot = p.slot_of(1, 1);
  for (int i = 0; i < 4; ++i) p.touch(2, 0);
  EXPECT_EQ(p.admit(2, 0), cold_slot);
  EXPECT_EQ(p.slot_of(1, 1), -1);
  EXPECT_EQ(p.slot_of(2, 0), cold_slot);
  EXPECT_EQ(p.owner(cold_slot), 2 * 4 + 0);
  EXPECT_EQ(p.filled(), 3);
  EXPECT_EQ(p.admit(2, 0), cold_slot);  // already resident: its slot, nothing changes
  EXPECT_EQ(p.evictions(), 1);
  EXPECT_EQ(p.admissions(), 1);
}

TEST(ResidencyPolicy, AdmitRefusesANewcomerNoHotterThanTheVictim) {
  ResidencyPolicy p({true}, 8, 2, Grouping::Off, 4096);
  p.set_scores(counts(1, 8, {{0, 0, 4}, {0, 1, 3}}));
  p.plan();
  for (int i = 0; i < 2; ++i) p.touch(0, 5);
  EXPECT_EQ(p.admit(0, 5), -1);  // 2 < 3
  p.touch(0, 5);
  EXPECT_EQ(p.admit(0, 5), -1);  // 3 == 3: an equal does not displace
  EXPECT_EQ(p.slot_of(0, 5), -1);
  EXPECT_EQ(p.admit(0, 6), -1);  // never routed
  p.touch(0, 5);
  EXPECT_EQ(p.admit(0, 5), p.range(0).first + 1);  // 4 > 3: takes (0,1)'s slot
  EXPECT_EQ(p.slot_of(0, 1), -1);
  EXPECT_EQ(p.evictions(), 1);
  EXPECT_EQ(p.admissions(), 1);
  ResidencyPolicy none({true}, 8, 0, Grouping::Off, 4096);  // no slots at all
  none.touch(0, 0);
  EXPECT_EQ(none.admit(0, 0), -1);
}

TEST(ResidencyPolicy, PinnedSlotsAreNotEvicted) {
  ResidencyPolicy p({true}, 8, 3, Grouping::Off, 4096);
  p.set_scores(counts(1, 8, {{0, 0, 1}, {0, 1, 2}, {0, 2, 3}}));
  p.plan();
  for (int i = 0; i < 10; ++i) p.touch(0, 4);
  ASSERT_EQ(owners(p), (std::vector<int64_t>{2, 1, 0}));  // best first
  p.pin(0, 0);                                            // the coldest
  EXPECT_EQ(p.admit(0, 4), 1);                            // the next coldest, (0,1)
  EXPECT_EQ(p.slot_of(0, 0), 2);
  // A key pinned before its admission is protected once it is in: the hotter (0,5) cannot take
  // (0,4)'s slot in the same visit.
  p.unpin_all();
  p.pin(0, 0);
  p.pin(0, 2);
  p.pin(0, 5);
  p.pin(0, 5);  // twice: fine
  for (int i = 0; i < 20; ++i) p.touch(0, 5);
  p.pin(0, 4);
  EXPECT_EQ(p.admit(0, 5), -1);  // every slot pinned
  EXPECT_EQ(p.slot_of(0, 4), 1);
  p.unpin_all();
  p.pin(0, 5);
  EXPECT_EQ(p.admit(0, 5), 2);  // (0,0), the coldest, is free to go now
  for (int i = 0; i < 30; ++i) p.touch(0, 6);
  p.pin(0, 2);
  p.pin(0, 4);
  EXPECT_EQ(p.admit(0, 6), -1);  // (0,5) was pinned before it came in
  EXPECT_EQ(p.slot_of(0, 5), 2);
  p.unpin_all();
  EXPECT_EQ(p.admit(0, 6), 0);  // (0,2): 3, the coldest
}

TEST(ResidencyPolicy, AdmitTakesAFreeSlotFirst) {
  for (Grouping g : {Grouping::Off, Grouping::Layout}) {
    ResidencyPolicy p({true, true}, 4, 4, g, 4096);
    p.set_scores(counts(2, 4, {{0, 0, 50}, {1, 0, 40}}));
    p.plan();
    ASSERT_EQ(p.filled(), 2);
    p.touch(0, 3);  // 1: colder than every resident, but a slot is free
    const int64_t s = p.admit(0, 3);
    ASSERT_GE(s, 0);
    EXPECT_EQ(p.owner(s), 3);
    EXPECT_EQ(p.filled(), 3);
    EXPECT_EQ(p.slot_of(0, 0), g == Grouping::Off ? 0 : p.range(0).first);
    EXPECT_EQ(p.evictions(), 0);
    EXPECT_EQ(p.admissions(), 1);
    if (g == Grouping::Layout) {
      // Layer 0's range (2 slots) is full now; layer 1's free slot is not for it.
      p.touch(0, 2);
      EXPECT_EQ(p.admit(0, 2), -1);
      EXPECT_EQ(p.filled(), 3);
    }
  }
}

TEST(ResidencyPolicy, SetScoresSizeMismatchThrows) {
  ResidencyPolicy p({true, true}, 4, 4, Grouping::Off, 4096);
  EXPECT_THROW(p.set_scores(std::vector<uint64_t>(7, 1)), moe::Error);
  EXPECT_THROW(p.set_scores(std::vector<uint64_t>(9, 1)), moe::Error);
  EXPECT_THROW(p.set_scores({}), moe::Error);
  EXPECT_NO_THROW(p.set_scores(std::vector<uint64_t>(8, 1)));
  EXPECT_DOUBLE_EQ(p.score(1, 3), 1.0);
}

TEST(ResidencyPolicy, BadArgumentsThrow) {
  EXPECT_THROW(ResidencyPolicy({}, 4, 4, Grouping::Off, 4096), moe::Error);
  EXPECT_THROW(ResidencyPolicy({true}, 0, 4, Grouping::Off, 4096), moe::Error);
  EXPECT_THROW(ResidencyPolicy({true}, -1, 4, Grouping::Off, 4096), moe::Error);
  EXPECT_THROW(ResidencyPolicy({true}, 4, -1, Grouping::Off, 4096), moe::Error);
  EXPECT_THROW(ResidencyPolicy({true}, 4, 4, Grouping::Off, 0), moe::Error);
  EXPECT_THROW(ResidencyPolicy({true}, 4, 4, Grouping::Off, -5), moe::Error);
  EXPECT_THROW(ResidencyPolicy({true}, 4, 4, Grouping::Off, std::nan("")), moe::Error);
  EXPECT_THROW(
      ResidencyPolicy({true}, 4, 4, Grouping::Off, std::numeric_limits<double>::infinity()),
      moe::Error);
  EXPECT_NO_THROW(ResidencyPolicy({true}, 4, 0, Grouping::Layout, 1));

  ResidencyPolicy p({true, false}, 4, 3, Grouping::Layout, 4096);
  for (auto [l, e] : {std::pair<int64_t, int64_t>{-1, 0}, {2, 0}, {0, -1}, {0, 4}, {1, 4}}) {
    EXPECT_THROW(p.touch(l, e), moe::Error) << l << " " << e;
    EXPECT_THROW(p.score(l, e), moe::Error) << l << " " << e;
    EXPECT_THROW(p.slot_of(l, e), moe::Error) << l << " " << e;
    EXPECT_THROW(p.admit(l, e), moe::Error) << l << " " << e;
    EXPECT_THROW(p.pin(l, e), moe::Error) << l << " " << e;
  }
  EXPECT_THROW(p.range(-1), moe::Error);
  EXPECT_THROW(p.range(2), moe::Error);
  EXPECT_THROW(p.owner(-1), moe::Error);
  EXPECT_THROW(p.owner(3), moe::Error);
  EXPECT_THROW(p.tick(-1), moe::Error);
  EXPECT_EQ(p.owner(2), -1);
  EXPECT_EQ(p.clock(), 0);
}

// Checks the tables after every call: slot_of and owner agree both ways, no key holds two slots,
// filled() counts the owned slots, only CPU-homed keys are resident, Layout ranges are contiguous
// and sum to n_slots, and Layout keys lie in their layer's range.
void check_invariants(const ResidencyPolicy& p, const std::vector<bool>& cpu, int step) {
  const int64_t n_layer = p.n_layer(), n_expert = p.n_expert();
  int64_t owned = 0;
  std::set<int64_t> seen;
  for (int64_t s = 0; s < p.n_slots(); ++s) {
    const int64_t k = p.owner(s);
    if (k < 0) continue;
    ++owned;
    ASSERT_TRUE(seen.insert(k).second) << "step " << step << ": key " << k << " in two slots";
    ASSERT_LT(k, n_layer * n_expert);
    ASSERT_TRUE(cpu[k / n_expert]) << "step " << step;
    ASSERT_EQ(p.slot_of(k / n_expert, k % n_expert), s) << "step " << step;
    const auto [first, count] = p.range(k / n_expert);
    ASSERT_GE(s, first) << "step " << step;
    ASSERT_LT(s, first + count) << "step " << step;
  }
  ASSERT_EQ(p.filled(), owned) << "step " << step;
  for (int64_t l = 0; l < n_layer; ++l) {
    for (int64_t e = 0; e < n_expert; ++e) {
      const int64_t s = p.slot_of(l, e);
      if (s >= 0) {
        ASSERT_EQ(p.owner(s), l * n_expert + e) << "step " << step;
      }
    }
  }
  if (p.grouping() == Grouping::Layout) {
    int64_t next = 0;
    for (int64_t l = 0; l < n_layer; ++l) {
      const auto [first, count] = p.range(l);
      ASSERT_EQ(first, next) << "step " << step << " layer " << l;
      ASSERT_GE(count, 0);
      if (!cpu[l]) {
        ASSERT_EQ(count, 0);
      }
      next += count;
    }
    ASSERT_EQ(next, p.n_slots()) << "step " << step;
  }
}

TEST(ResidencyPolicy, RandomCallsKeepTheTablesConsistent) {
  const std::vector<bool> cpu = {true, false, true, true, false, true};
  const int64_t n_layer = 6, n_expert = 16;
  for (Grouping g : {Grouping::Off, Grouping::Layout}) {
    for (int64_t n_slots : {0, 1, 23, 41}) {
      std::mt19937 rng(1234 + static_cast<unsigned>(n_slots));
      ResidencyPolicy p(cpu, n_expert, n_slots, g, 20);  // re-bases internally every ~1300 tokens
      // Skewed routing that shifts over time: expert popularity drawn from a geometric-like
      // distribution around a drifting hot spot.
      std::geometric_distribution<int64_t> near(0.25);
      std::uniform_int_distribution<int> op(0, 99);
      std::uniform_int_distribution<int64_t> layer_of(0, n_layer - 1);
      std::set<int64_t> pinned;
      int64_t admitted = 0, evicted = 0;
      for (int step = 0; step < 12000; ++step) {
        const int64_t hot = (step / 3000) * 5;
        const int64_t l = layer_of(rng), e = (hot + near(rng)) % n_expert;
        const int o = op(rng);
        if (o < 45) {
          p.touch(l, e);
        } else if (o < 55) {
          p.tick(1 + static_cast<int64_t>(rng() % 8));
        } else if (o < 85) {
          const int64_t before = p.slot_of(l, e), filled = p.filled();
          const std::vector<int64_t> was = owners(p);
          const int64_t s = p.admit(l, e);
          const double newcomer = p.score(l, e);
          // The unpinned candidates' coldest score (the slots of its pool or range).
          const auto [first, count] = p.range(l);
          double coldest = std::numeric_limits<double>::infinity();
          bool free_slot = false;
          for (int64_t t = first; t < first + count && cpu[l]; ++t) {
            if (was[t] < 0) free_slot = true;
            if (was[t] >= 0 && !pinned.count(was[t])) {
              coldest = std::min(coldest, p.score(was[t] / n_expert, was[t] % n_expert));
            }
          }
          if (before >= 0) {
            ASSERT_EQ(s, before);
            ASSERT_EQ(owners(p), was);
          } else if (s >= 0) {
            ASSERT_TRUE(cpu[l]);
            ASSERT_GE(s, first);
            ASSERT_LT(s, first + count);
            ASSERT_EQ(p.slot_of(l, e), s);
            ++admitted;
            if (was[s] >= 0) {  // displaced the coldest unpinned candidate, a colder one
              ASSERT_FALSE(free_slot) << "step " << step;
              ASSERT_FALSE(pinned.count(was[s])) << "step " << step;
              const double victim = p.score(was[s] / n_expert, was[s] % n_expert);
              ASSERT_LE(victim, coldest * (1 + 1e-12)) << "step " << step;
              ASSERT_LT(victim, newcomer * (1 + 1e-12)) << "step " << step;
              ASSERT_EQ(p.filled(), filled);
              ++evicted;
            } else {
              ASSERT_EQ(p.filled(), filled + 1);
            }
          } else {
            ASSERT_EQ(owners(p), was);
            ASSERT_FALSE(free_slot && cpu[l]) << "step " << step;
            if (cpu[l]) {
              ASSERT_GE(coldest, newcomer * (1 - 1e-12)) << "step " << step;
            }
          }
        } else if (o < 92) {
          p.pin(l, e);
          pinned.insert(l * n_expert + e);
        } else if (o < 96) {
          p.unpin_all();
          pinned.clear();
        } else if (o < 99) {
          const std::vector<int64_t> before = owners(p);
          const auto changes = p.plan();
          std::vector<int64_t> after = before;
          int64_t last = -1;
          for (const auto& c : changes) {
            ASSERT_GT(c.slot, last);  // ascending, each slot once
            last = c.slot;
            ASSERT_NE(before[c.slot], c.key);  // only changes
            after[c.slot] = c.key;
          }
          ASSERT_EQ(after, owners(p)) << "step " << step;
          // The resident keys are each group's top keys with a score > 0.
          for (int64_t k = 0; k < n_layer * n_expert; ++k) {
            const double sk = p.score(k / n_expert, k % n_expert);
            const bool resident = p.slot_of(k / n_expert, k % n_expert) >= 0;
            if (!cpu[k / n_expert] || sk <= 0) {
              ASSERT_FALSE(resident);
              continue;
            }
            // Keys of k's group that rank above k.
            int64_t above = 0;
            for (int64_t j = 0; j < n_layer * n_expert; ++j) {
              if (!cpu[j / n_expert]) continue;
              if (g == Grouping::Layout && j / n_expert != k / n_expert) continue;
              const double sj = p.score(j / n_expert, j % n_expert);
              if (sj > sk || (sj == sk && j < k)) ++above;
            }
            ASSERT_EQ(resident, above < p.range(k / n_expert).second)
                << "step " << step << " key " << k;
          }
        } else {
          std::vector<uint64_t> c(n_layer * n_expert);
          for (auto& x : c) x = rng() % 4 == 0 ? rng() % 100 : 0;
          p.set_scores(c);
        }
        check_invariants(p, cpu, step);
        if (HasFatalFailure()) return;
      }
      EXPECT_EQ(p.admissions(), admitted);
      EXPECT_EQ(p.evictions(), evicted);
      if (n_slots > 0) {
        EXPECT_GT(admitted, 0) << "slots " << n_slots;  // the mix did exercise admissions
        EXPECT_GT(evicted, 0) << "slots " << n_slots;
      }
    }
  }
}

}  // namespace
