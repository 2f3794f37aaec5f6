// GET /metrics as Prometheus reads it, through the real processes: the exposition parses, every
// counter is named *_total and no other metric is, counters never go back -- not even across a
// kill -9 of the CPU worker and its restart -- and the tokens of a stream the client cancelled
// midway are counted. (promtool would lint the first two, but Debian ships it only inside the
// Prometheus server package; the checks below are the ones it makes that matter here.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/coordinator_harness.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using Ms = std::chrono::milliseconds;

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q4_0.gguf").string(); }

v1::GenerateRequest short_request(const std::string& text) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.set_max_tokens(8);
  r.set_seed(1);
  return r;
}

std::string get_metrics(const Coordinator& c) {
  const std::string cmd = "curl -sS --max-time 10 'http://" + c.http_addr() + "/metrics' 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  ::pclose(p);
  return out;
}

// The text exposition format (version 0.0.4), parsed strictly enough to catch what Prometheus
// or promtool would reject or warn about.
struct Exposition {
  std::map<std::string, std::string> types;      // family -> counter, gauge, histogram, ...
  std::map<std::string, double> samples;         // "name{labels}" as written -> value
  std::map<std::string, std::string> family_of;  // sample key -> its family
  std::vector<std::string> problems;

  // The samples that may only grow: counters, and a histogram's or summary's count, sum and
  // buckets.
  std::map<std::string, double> monotonic() const {
    std::map<std::string, double> out;
    for (const auto& [key, v] : samples) {
      const std::string& type = types.at(family_of.at(key));
      const std::string name = key.substr(0, key.find('{'));
      if (type == "counter" || name.ends_with("_count") || name.ends_with("_sum") ||
          name.ends_with("_bucket")) {
        out[key] = v;
      }
    }
    return out;
  }

  // The one sample whose key starts with `prefix` (a name and the start of its labels).
  std::optional<double> value(const std::string& prefix) const {
    std::optional<double> found;
    for (const auto& [key, v] : samples) {
      if (key.rfind(prefix, 0) == 0) {
        if (found) return std::nullopt;  // ambiguous
        found = v;
      }
    }
    return found;
  }
};

Exposition parse(const std::string& text) {
  static const std::regex type_line(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+))");
  static const std::regex help_line(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  // name{label="value",...} value [timestamp]; a value may hold \\, \" and \n escapes.
  static const std::regex sample_line(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*\})? )"
      R"((\S+)( -?[0-9]+)?)");
  Exposition e;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    std::smatch m;
    if (line.empty()) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      if (!std::regex_match(line, m, type_line)) {
        e.problems.push_back("bad TYPE line: " + line);
        continue;
      }
      static const std::set<std::string> kinds = {"counter", "gauge", "histogram", "summary",
                                                  "untyped"};
      if (kinds.count(m[2]) == 0) e.problems.push_back("unknown type: " + line);
      if (!e.types.emplace(m[1], m[2]).second) e.problems.push_back("TYPE twice: " + line);
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) {
      if (!std::regex_match(line, help_line)) e.problems.push_back("bad HELP line: " + line);
      continue;
    }
    if (line[0] == '#') continue;  // a comment
    if (!std::regex_match(line, m, sample_line)) {
      e.problems.push_back("not a sample: " + line);
      continue;
    }
    const std::string name = m[1], key = name + std::string(m[2]), value = m[3];
    char* rest = nullptr;
    const double v = std::strtod(value.c_str(), &rest);
    if (rest == value.c_str() || *rest != '\0') {
      e.problems.push_back("bad value: " + line);
      continue;
    }
    // Its family: the name itself, or for a histogram or summary the name less its suffix.
    std::string family = name;
    if (e.types.count(family) == 0) {
      for (const char* suffix : {"_bucket", "_count", "_sum"}) {
        const std::string s = suffix;
        if (name.ends_with(s) && e.types.count(name.substr(0, name.size() - s.size()))) {
          family = name.substr(0, name.size() - s.size());
        }
      }
    }
    const auto type = e.types.find(family);
    if (type == e.types.end()) {
      e.problems.push_back("sample without a TYPE before it: " + line);
      continue;
    }
    if ((type->second == "counter" || type->second == "gauge") && family != name) {
      e.problems.push_back("sample name differs from its " + type->second + ": " + line);
    }
    if (type->second == "counter" && (!(v >= 0) || std::isinf(v))) {
      e.problems.push_back("counter not a finite non-negative number: " + line);
    }
    if (!e.samples.emplace(key, v).second) e.problems.push_back("sample twice: " + line);
    e.family_of[key] = family;
  }
  // Prometheus' naming conventions: a counter's name ends in _total, and only a counter's does.
  for (const auto& [family, type] : e.types) {
    const bool total = family.ends_with("_total");
    if (type == "counter" && !total) e.problems.push_back("counter without _total: " + family);
    if (type != "counter" && total) e.problems.push_back(type + " named _total: " + family);
  }
  return e;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += "  " + x + "\n";
  return s;
}

TEST(MetricsExposition, ParserCatchesWhatPrometheusWouldNot) {
  const Exposition e = parse(
      "# TYPE a_total counter\na_total 1\n"
      "# TYPE busy_seconds gauge\nbusy_seconds{w=\"0\"} 2.5\n"
      "# TYPE restarts counter\nrestarts{w=\"0\"} 1\n"
      "# TYPE up_total gauge\nup_total 1\n"
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 3\nh_sum 1.5\nh_count 3\n"
      "orphan 1\na_total 2\nbad{x=1} 1\n");
  const std::string all = join(e.problems);
  EXPECT_EQ(e.problems.size(), 5u) << all;
  EXPECT_NE(all.find("counter without _total: restarts"), std::string::npos) << all;
  EXPECT_NE(all.find("gauge named _total: up_total"), std::string::npos) << all;
  EXPECT_NE(all.find("without a TYPE before it: orphan"), std::string::npos) << all;
  EXPECT_NE(all.find("sample twice: a_total"), std::string::npos) << all;
  EXPECT_NE(all.find("not a sample: bad{x=1}"), std::string::npos) << all;
  EXPECT_EQ(e.monotonic().size(), 5u);  // a_total, restarts and the histogram's three
}

TEST(Metrics, CountersAreTotalsThatSurviveAWorkersRestart) {
  Coordinator c(model_path(), {"-c", "4096", "--http-port", "0"});
  ASSERT_TRUE(run_stream(*c.gen, short_request("warm up")).status.ok());
  const std::string busy = "moe_worker_busy_seconds_total{";
  // The worker reports its busy time with its heartbeats (every 500 ms).
  EXPECT_TRUE(
      wait_until([&] { return parse(get_metrics(c)).value(busy).value_or(0) > 0; }, Ms(5000)))
      << get_metrics(c);

  // Kill the worker mid-generation; the next request starts a new one.
  const pid_t victim = c.placement().workers(0).pid();
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(60)));
  const StreamResult r = run_stream(*c.gen, long_request(), ctx, [&](const StreamResult& s) {
    if (s.chunks == 40) ::kill(victim, SIGKILL);
  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  ASSERT_TRUE(gone_within(victim, Ms(2000)));
  const Exposition before = parse(get_metrics(c));
  EXPECT_TRUE(before.problems.empty()) << join(before.problems);
  const double busy_before = before.value(busy).value_or(0);
  EXPECT_GT(busy_before, 0);

  ASSERT_TRUE(run_stream(*c.gen, short_request("after the crash")).status.ok());
  // The new process has reported busy time of its own (which starts again from zero).
  EXPECT_TRUE(wait_until(
      [&] {
        const v1::GetStatsResponse s = c.stats();
        return s.workers_size() == 1 && s.workers(0).restarts() == 1 && s.workers(0).busy_ms() > 0;
      },
      Ms(5000)));
  const Exposition after = parse(get_metrics(c));
  EXPECT_TRUE(after.problems.empty()) << join(after.problems);
  EXPECT_EQ(after.value("moe_worker_restarts_total{").value_or(0), 1);
  EXPECT_GT(after.value(busy).value_or(0), busy_before);
  // No counter went back, and none disappeared.
  const std::map<std::string, double> grown = after.monotonic();
  for (const auto& [key, v] : before.monotonic()) {
    const auto it = grown.find(key);
    ASSERT_NE(it, grown.end()) << key << " is gone";
    EXPECT_GE(it->second, v) << key << " went back";
  }
  for (const char* family :
       {"moe_layer_routed_items_total", "moe_layer_expert_seconds_total",
        "moe_layer_gpu_hits_total", "moe_layer_gpu_misses_total", "moe_worker_busy_seconds_total",
        "moe_worker_restarts_total", "moe_generated_tokens_total", "moe_prompt_tokens_total"}) {
    const auto t = after.types.find(family);
    EXPECT_TRUE(t != after.types.end() && t->second == "counter") << family;
  }
  EXPECT_TRUE(c.stop());
}

TEST(Metrics, TokensOfACancelledStreamAreCounted) {
  Coordinator c(model_path(), {"-c", "4096", "--http-port", "0"});
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(60)));
  const StreamResult r = run_stream(*c.gen, long_request(), ctx, [&](const StreamResult& s) {
    if (s.chunks == 5) ctx.TryCancel();
  });
  ASSERT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_GE(r.tokens.size(), 5u);
  Exposition e;
  EXPECT_TRUE(wait_until(
      [&] {
        e = parse(get_metrics(c));
        return e.value("moe_requests_total{outcome=\"cancelled\"}").value_or(0) == 1;
      },
      Ms(3000)));
  // At least the tokens the client saw, and the prompt that was evaluated for them.
  EXPECT_GE(e.value("moe_generated_tokens_total").value_or(0), 5);
  EXPECT_GT(e.value("moe_prompt_tokens_total").value_or(0), 0);
  EXPECT_TRUE(c.stop());
}

}  // namespace
}  // namespace moe::test
