// A real HTTP client (curl) for the tests of the coordinator's HTTP API: the request body goes
// through a file (no shell quoting of JSON) and the status code comes back with the body.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace moe::test {

struct HttpReply {
  int status = 0;
  std::string body;
};

// curl with the body in a file (no shell quoting of JSON); the status code is the last line.
inline HttpReply curl(const std::string& method, const std::string& url,
                      const std::string& body = "", const std::string& extra = "") {
  static int n = 0;
  const std::string file =
      (std::filesystem::temp_directory_path() /
       ("moe_http_body_" + std::to_string(::getpid()) + "_" + std::to_string(n++)))
          .string();
  std::string cmd =
      "curl -sS -N --max-time 60 -X " + method + " " + extra + " -w '\\n%{http_code}' ";
  if (!body.empty()) {
    std::ofstream(file, std::ios::binary) << body;
    cmd += "-H 'Content-Type: application/json' --data-binary @" + file + " ";
  }
  cmd += "'" + url + "' 2>&1";
  HttpReply r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) r.body.append(buf, got);
  ::pclose(p);
  std::filesystem::remove(file);
  const size_t nl = r.body.rfind('\n');
  if (nl != std::string::npos) {
    r.status = std::atoi(r.body.c_str() + nl + 1);
    r.body.resize(nl);
  }
  return r;
}

inline void expect_error(const HttpReply& r, int status, const std::string& part) {
  EXPECT_EQ(r.status, status) << r.body;
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(part), std::string::npos) << r.body;
}

}  // namespace moe::test
