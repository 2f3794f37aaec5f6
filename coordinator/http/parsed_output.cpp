#include "coordinator/http/parsed_output.h"

#include <algorithm>
#include <cstdint>

namespace moe::http {
namespace {

// splitmix64's output function: a bijection of 64-bit words.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void append_base62(uint64_t v, int digits, std::string& out) {
  static constexpr char kDigits[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  for (int i = 0; i < digits; ++i) {
    out += kDigits[v % 62];
    v /= 62;
  }
}

}  // namespace

void ParsedDelta::append(const ParsedDelta& d) {
  content += d.content;
  reasoning += d.reasoning;
  tool_calls.insert(tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

std::string tool_call_id(std::string_view seed, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the seed
  for (const char c : seed) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  // Distinct n give distinct states (the step is odd), and mix64 keeps them distinct; 11 base-62
  // digits hold all 64 bits, so the first 11 characters already differ. The rest is decoration.
  const uint64_t state = h + static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ULL;
  std::string id = "call_";
  append_base62(mix64(state), 11, id);
  append_base62(mix64(state ^ 0x5851f42d4c957f2dULL), 11, id);
  return id;
}

size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

size_t incomplete_utf8_suffix(std::string_view s) {
  for (size_t i = 1; i <= 3 && i <= s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[s.size() - i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    if (c < 0xC0) return 0;            // ASCII
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    return need > i ? i : 0;
  }
  return 0;
}

}  // namespace moe::http
