// Shared helpers for the tokenizer tests: cached tokenizers for the test vocabularies and
// readers for the JSONL goldens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/testdata.h"

namespace moe::test {

inline moe::tokenizer::Tokenizer load_tokenizer(const std::filesystem::path& p) {
  const auto f = moe::gguf::GgufFile::open(p.string());
  return moe::tokenizer::Tokenizer::from_gguf(f);
}

// Real Qwen3 vocabulary (151,936 ids) and the 2,112-id small vocabulary; loaded once.
inline const moe::tokenizer::Tokenizer& qwen3_tokenizer() {
  static const auto t = load_tokenizer(testdata_dir() / "models" / "qwen3-vocab-only.gguf");
  return t;
}
inline const moe::tokenizer::Tokenizer& sv_tokenizer() {
  static const auto t = load_tokenizer(testdata_dir() / "models" / "tiny-qwen3moe-sv-Q8_0.gguf");
  return t;
}

inline std::filesystem::path tokenizer_golden(const std::string& name) {
  return testdata_dir() / "golden" / "tokenizer" / name;
}

inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

inline std::string to_hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

inline std::string ids_str(const std::vector<int32_t>& ids) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < ids.size(); ++i) o << (i ? ", " : "") << ids[i];
  o << ']';
  return o.str();
}

}  // namespace moe::test
