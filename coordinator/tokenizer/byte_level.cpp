#include "coordinator/tokenizer/byte_level.h"

#include <array>
#include <vector>

#include "coordinator/tokenizer/utf8.h"

namespace moe::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};  // every mapped code point is below U+0144
};

const Tables& tables() {
  static const Tables t = [] {
    Tables r;
    r.to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = self ? char32_t(b) : next++;
      r.to_cp[static_cast<size_t>(b)] = cp;
      r.to_byte[cp] = static_cast<int16_t>(b);
    }
    return r;
  }();
  return t;
}

}  // namespace

char32_t byte_to_codepoint(uint8_t b) { return tables().to_cp[b]; }

int codepoint_to_byte(char32_t cp) { return cp < 512 ? tables().to_byte[cp] : -1; }

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_codepoint(static_cast<uint8_t>(c)));
  return out;
}

std::string byte_level_decode(std::string_view text) {
  std::vector<char32_t> cps;
  decode_utf8_lenient(text, cps);
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) {
    const int b = codepoint_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      append_utf8(out, cp);
    }
  }
  return out;
}

}  // namespace moe::tokenizer
