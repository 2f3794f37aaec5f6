#include "coordinator/residency/routing_profile.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"

namespace moe::model {
namespace {

constexpr const char* kFormat = "moe-runtime routing profile";
constexpr int kVersion = 1;
// Far above any real model (Qwen3: 48 x 128); bounds what a corrupt file can make us allocate.
constexpr int64_t kMaxEntries = int64_t{1} << 24;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error("routing profile " + path + ": " + why);
}

}  // namespace

std::optional<RoutingProfile> RoutingProfile::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", "") != kFormat) fail(path, "not a routing profile");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kVersion) {
    fail(path, "unsupported version (this build reads version " + std::to_string(kVersion) + ")");
  }
  RoutingProfile p;
  const auto& a = j.value("arch", nlohmann::json());
  const auto& nl = j.value("n_layer", nlohmann::json());
  const auto& ne = j.value("n_expert", nlohmann::json());
  const auto& c = j.value("counts", nlohmann::json());
  if (!a.is_string() || !nl.is_number_unsigned() || !ne.is_number_unsigned() || !c.is_array()) {
    fail(path, "arch, n_layer, n_expert and counts are required");
  }
  p.arch = a.get<std::string>();
  p.n_layer = nl.get<int64_t>();
  p.n_expert = ne.get<int64_t>();
  if (p.n_layer < 1 || p.n_expert < 1 || p.n_layer > kMaxEntries / p.n_expert) {
    fail(path,
         "implausible shape " + std::to_string(p.n_layer) + " x " + std::to_string(p.n_expert));
  }
  if (static_cast<int64_t>(c.size()) != p.n_layer * p.n_expert) {
    fail(path, "counts has " + std::to_string(c.size()) + " entries, n_layer x n_expert is " +
                   std::to_string(p.n_layer * p.n_expert));
  }
  p.counts.reserve(c.size());
  for (const auto& v : c) {
    if (!v.is_number_unsigned()) fail(path, "counts must be non-negative integers");
    p.counts.push_back(v.get<uint64_t>());
  }
  return p;
}

void RoutingProfile::save(const std::string& path) const {
  nlohmann::json j = {{"format", kFormat},  {"version", kVersion},  {"arch", arch},
                      {"n_layer", n_layer}, {"n_expert", n_expert}, {"counts", counts}};
  // Written beside the target and renamed over it: a crash mid-write leaves the old profile.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot write " + tmp + ": " + std::strerror(errno));
    out << j.dump() << '\n';
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail(path, "write failed: " + std::string(std::strerror(errno)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail(path, "cannot replace it: " + ec.message());
  }
}

void RoutingProfile::check_matches(const std::string& a, int64_t nl, int64_t ne,
                                   const std::string& path) const {
  if (a != arch || nl != n_layer || ne != n_expert) {
    fail(path, "recorded for a " + arch + " model with " + std::to_string(n_layer) + " layers x " +
                   std::to_string(n_expert) + " experts, this model is " + a + " with " +
                   std::to_string(nl) + " x " + std::to_string(ne) +
                   " (use another file, or delete this one to start a new profile)");
  }
}

}  // namespace moe::model
