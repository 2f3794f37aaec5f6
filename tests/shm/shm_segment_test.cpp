// Named shared-memory segments: create/open/remove, ownership, name rules and stale cleanup.
#include "common/shm/shm_segment.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "common/error.h"

namespace {

using moe::shm::ShmSegment;
namespace fs = std::filesystem;

bool exists_in_dev_shm(const std::string& name) { return fs::exists("/dev/shm" + name); }

// Runs `fn` and returns the moe::Error message it throws ("" when it throws nothing).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShmSegment, CreateOpenAndRemoveOnDestruction) {
  const std::string name = moe::shm::run_segment_name("seg-create");
  {
    ShmSegment seg = ShmSegment::create(name, 10000);
    EXPECT_EQ(seg.name(), name);
    EXPECT_EQ(seg.size(), 10000u);
    EXPECT_TRUE(seg.owner());
    EXPECT_TRUE(exists_in_dev_shm(name));
    std::memcpy(seg.data(), "hello", 6);

    ShmSegment view = ShmSegment::open(name);  // a second mapping of the same pages
    EXPECT_FALSE(view.owner());
    EXPECT_EQ(view.size(), 10000u);
    EXPECT_NE(view.data(), seg.data());
    EXPECT_STREQ(static_cast<const char*>(view.data()), "hello");
    EXPECT_EQ(static_cast<const unsigned char*>(view.data())[9999], 0);  // zero-filled
  }
  EXPECT_FALSE(exists_in_dev_shm(name));
  const std::string err = error_of([&] { ShmSegment::open(name); });
  EXPECT_NE(err.find(name), std::string::npos) << err;
  EXPECT_NE(err.find("No such file"), std::string::npos) << err;
}

TEST(ShmSegment, OpenerDoesNotRemove) {
  const std::string name = moe::shm::run_segment_name("seg-opener");
  ShmSegment seg = ShmSegment::create(name, 4096);
  { ShmSegment view = ShmSegment::open(name); }
  EXPECT_TRUE(exists_in_dev_shm(name));
}

TEST(ShmSegment, CreateTwiceFails) {
  const std::string name = moe::shm::run_segment_name("seg-twice");
  ShmSegment first = ShmSegment::create(name, 4096);
  const std::string err = error_of([&] { ShmSegment::create(name, 4096); });
  EXPECT_NE(err.find(name), std::string::npos) << err;
  EXPECT_NE(err.find("exists"), std::string::npos) << err;
  EXPECT_TRUE(exists_in_dev_shm(name));  // the failed create must not remove the first one's
}

TEST(ShmSegment, MoveTransfersOwnership) {
  const std::string name = moe::shm::run_segment_name("seg-move");
  ShmSegment a = ShmSegment::create(name, 4096);
  ShmSegment b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is defined
  EXPECT_FALSE(a.owner());
  EXPECT_TRUE(b.owner());
  { ShmSegment sink = std::move(b); }
  EXPECT_FALSE(exists_in_dev_shm(name));
}

TEST(ShmSegment, RejectsBadNamesAndSizes) {
  for (const char* bad : {"", "/", "noslash", "/a/b"}) {
    EXPECT_NE(error_of([&] { ShmSegment::create(bad, 4096); }), "") << bad;
  }
  EXPECT_NE(error_of([&] { ShmSegment::create("/" + std::string(300, 'x'), 4096); }), "");
  const std::string name = moe::shm::run_segment_name("seg-zero");
  EXPECT_NE(error_of([&] { ShmSegment::create(name, 0); }).find("size 0"), std::string::npos);
  EXPECT_FALSE(exists_in_dev_shm(name));
}

TEST(ShmSegment, RunSegmentNames) {
  EXPECT_EQ(moe::shm::run_segment_name("work-0.ring"),
            "/moe-" + std::to_string(::getpid()) + "-work-0.ring");
  for (const char* bad : {"", "a/b", "a b", "ü"}) {
    EXPECT_NE(error_of([&] { moe::shm::run_segment_name(bad); }), "") << bad;
  }
  EXPECT_NE(error_of([&] { moe::shm::run_segment_name(std::string(201, 'r')); }), "");
}

TEST(ShmSegment, RemoveStaleSegmentsOfDeadProcesses) {
  const std::string live = moe::shm::run_segment_name("seg-live");
  ShmSegment mine = ShmSegment::create(live, 4096);
  // The child leaves its segment behind, as a crashed process would (_exit skips destructors).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      ShmSegment leaked = ShmSegment::create(moe::shm::run_segment_name("seg-stale"), 4096);
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string stale = "/moe-" + std::to_string(child) + "-seg-stale";
  ASSERT_TRUE(exists_in_dev_shm(stale));

  // Other test processes clean up at start too and may have removed it first, so the count is
  // not asserted; what matters is that it is gone and the live one is not.
  moe::shm::remove_stale_segments();
  EXPECT_FALSE(exists_in_dev_shm(stale));
  EXPECT_TRUE(exists_in_dev_shm(live));  // our pid is alive
}

}  // namespace
