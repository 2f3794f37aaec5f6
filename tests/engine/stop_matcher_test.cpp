#include "coordinator/engine/stop_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace moe::engine {
namespace {

// Feeds `pieces` and returns (released text, matched stop or "").
std::pair<std::string, std::string> feed(std::vector<std::string> stops,
                                         const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const std::string& p : pieces) {
    const StopMatcher::Step s = m.push(p);
    out += s.release;
    if (s.stop) return {out, *s.stop};
  }
  return {out + m.flush(), ""};
}

TEST(StopMatcher, HoldsBackPrefixesAndCutsAtTheStop) {
  EXPECT_EQ(feed({"</s>"}, {"Hello", " wor", "ld</", "s> more"}),
            std::make_pair(std::string("Hello world"), std::string("</s>")));
  // A prefix that turns out not to be the stop is released, not lost.
  EXPECT_EQ(feed({"</s>"}, {"a<", "/x", "b"}), std::make_pair(std::string("a</xb"), std::string()));
  // The earliest match wins among several stop strings.
  EXPECT_EQ(feed({"world", "lo w"}, {"Hello world"}),
            std::make_pair(std::string("Hel"), std::string("lo w")));
  // No stop strings: everything passes at once.
  StopMatcher none({});
  EXPECT_EQ(none.push("abc").release, "abc");
}

TEST(StopMatcher, ReleasedTextNeverContainsPartOfAStopAcrossRandomSplits) {
  std::mt19937 rng(3);
  const std::string text = "one two three STOP four";
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 4;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    StopMatcher m({"STOP"});
    std::string out;
    bool stopped = false;
    for (const std::string& p : pieces) {
      const StopMatcher::Step s = m.push(p);
      out += s.release;
      // Nothing after "three " may be released before the match.
      EXPECT_EQ(out.find('S'), std::string::npos);
      if (s.stop) {
        stopped = true;
        break;
      }
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(out, "one two three ");
  }
}

}  // namespace
}  // namespace moe::engine
