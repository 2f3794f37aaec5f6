// RoutingProfile (--moe-profile FILE): saved and loaded back equal; a missing file is a cold
// start; a file that is not a profile, is corrupt or truncated, or was recorded for another
// model's shape is refused with a message naming the file.
#include "coordinator/residency/routing_profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "common/error.h"

namespace {

namespace fs = std::filesystem;
using moe::model::RoutingProfile;

class RoutingProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moe_routing_profile_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
  }
  void expect_refused(const std::string& name, const std::string& part) const {
    try {
      (void)RoutingProfile::load(path(name));
      ADD_FAILURE() << name << ": loaded";
    } catch (const moe::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path(name)), std::string::npos) << what;
      EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  }
  fs::path dir_;
};

TEST_F(RoutingProfileTest, SavedProfileLoadsBackEqual) {
  RoutingProfile p;
  p.arch = "qwen3moe";
  p.n_layer = 3;
  p.n_expert = 5;
  std::mt19937_64 rng(42);
  for (int i = 0; i < 15; ++i) p.counts.push_back(rng() >> (i % 40));  // up to 64-bit counts
  p.save(path("p.json"));
  const auto q = RoutingProfile::load(path("p.json"));
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->arch, p.arch);
  EXPECT_EQ(q->n_layer, 3);
  EXPECT_EQ(q->n_expert, 5);
  EXPECT_EQ(q->counts, p.counts);
  // Saving again replaces the file and leaves no temporary behind.
  p.counts[0] = 7;
  p.save(path("p.json"));
  EXPECT_EQ(RoutingProfile::load(path("p.json"))->counts[0], 7u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  EXPECT_NO_THROW(q->check_matches("qwen3moe", 3, 5, path("p.json")));
}

TEST_F(RoutingProfileTest, MissingFileIsAColdStart) {
  EXPECT_FALSE(RoutingProfile::load(path("absent.json")).has_value());
}

TEST_F(RoutingProfileTest, CorruptFilesAreRefused) {
  const std::string good =
      R"({"format":"moe-runtime routing profile","version":1,"arch":"qwen3moe",)"
      R"("n_layer":1,"n_expert":2,"counts":[3,4]})";
  write("good.json", good);
  ASSERT_TRUE(RoutingProfile::load(path("good.json")).has_value());
  for (size_t cut = 1; cut < good.size(); cut += 7) {  // truncation anywhere
    write("cut.json", good.substr(0, cut));
    EXPECT_THROW((void)RoutingProfile::load(path("cut.json")), moe::Error) << cut;
  }
  write("json.json", "{not json");
  expect_refused("json.json", "not valid JSON");
  write("other.json", R"({"format":"something else","version":1})");
  expect_refused("other.json", "not a routing profile");
  write("version.json", R"({"format":"moe-runtime routing profile","version":2})");
  expect_refused("version.json", "unsupported version");
  const std::string head = R"({"format":"moe-runtime routing profile","version":1,)";
  write("missing.json", head + R"("arch":"qwen3moe","n_layer":1,"n_expert":2})");
  expect_refused("missing.json", "counts are required");
  write("count.json", head + R"("arch":"qwen3moe","n_layer":2,"n_expert":2,"counts":[1,2,3]})");
  expect_refused("count.json", "counts has 3 entries, n_layer x n_expert is 4");
  write("neg.json", head + R"("arch":"qwen3moe","n_layer":1,"n_expert":2,"counts":[1,-2]})");
  expect_refused("neg.json", "non-negative integers");
  write("float.json", head + R"("arch":"qwen3moe","n_layer":1,"n_expert":2,"counts":[1,2.5]})");
  expect_refused("float.json", "non-negative integers");
  write("huge.json",
        head + R"("arch":"qwen3moe","n_layer":4294967296,"n_expert":4294967296,"counts":[]})");
  expect_refused("huge.json", "implausible shape");
  write("zero.json", head + R"("arch":"qwen3moe","n_layer":0,"n_expert":2,"counts":[]})");
  expect_refused("zero.json", "implausible shape");
}

TEST_F(RoutingProfileTest, ProfileOfAnotherModelIsRefused) {
  RoutingProfile p{"qwen3moe", 48, 128, std::vector<uint64_t>(48 * 128, 1)};
  EXPECT_NO_THROW(p.check_matches("qwen3moe", 48, 128, "f"));
  for (const auto& [arch, nl, ne] :
       {std::tuple{"qwen35moe", 48, 128}, std::tuple{"qwen3moe", 40, 128},
        std::tuple{"qwen3moe", 48, 256}}) {
    try {
      p.check_matches(arch, nl, ne, "prof.json");
      ADD_FAILURE() << arch << " " << nl << " " << ne;
    } catch (const moe::Error& e) {
      EXPECT_NE(std::string(e.what()).find("recorded for a qwen3moe model with 48 layers x 128"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(RoutingProfileTest, UnwritablePathIsAClearError) {
  RoutingProfile p{"qwen3moe", 1, 1, {1}};
  EXPECT_THROW(p.save(path("no/such/dir/p.json")), moe::Error);
}

}  // namespace
