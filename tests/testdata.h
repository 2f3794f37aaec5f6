// Locates ../shared/testdata for tests: MOE_TESTDATA from the environment, else the configured
// default. A missing folder is a test failure, never a skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moe::test {

inline std::filesystem::path testdata_dir() {
  const char* env = std::getenv("MOE_TESTDATA");
  std::filesystem::path dir = (env && *env) ? env : MOE_TESTDATA_DEFAULT;
  if (!std::filesystem::is_directory(dir / "models")) {
    throw std::runtime_error("golden test data not found at '" + dir.string() +
                             "' (set MOE_TESTDATA to the folder holding models/ and golden/)");
  }
  return dir;
}

// A golden folder holding models/ and golden/: `env` from the environment, else the configured
// default; missing is a failure, never a skip.
inline std::filesystem::path golden_folder(const char* env, const char* fallback,
                                           const std::string& what) {
  const char* value = std::getenv(env);
  std::filesystem::path dir = (value && *value) ? value : fallback;
  if (!std::filesystem::is_directory(dir / "models") ||
      !std::filesystem::is_directory(dir / "golden")) {
    throw std::runtime_error(what + " test data not found at '" + dir.string() + "' (set " + env +
                             " to the folder holding models/ and golden/)");
  }
  return dir;
}

// The tiny qwen35moe models and goldens (MOE_TESTDATA_QWEN35MOE).
inline std::filesystem::path qwen35moe_testdata_dir() {
  return golden_folder("MOE_TESTDATA_QWEN35MOE", MOE_TESTDATA_QWEN35MOE_DEFAULT, "qwen35moe");
}

// The tiny gpt-oss model, its goldens and the vocab-only GGUF of the real tokenizer
// (MOE_TESTDATA_GPTOSS).
inline std::filesystem::path gptoss_testdata_dir() {
  return golden_folder("MOE_TESTDATA_GPTOSS", MOE_TESTDATA_GPTOSS_DEFAULT, "gpt-oss");
}

// Raw little-endian file of T.
template <typename T>
std::vector<T> read_raw(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  const auto bytes = static_cast<size_t>(f.tellg());
  std::vector<T> v(bytes / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  return v;
}

}  // namespace moe::test
