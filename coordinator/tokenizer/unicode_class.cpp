#include "coordinator/tokenizer/unicode_class.h"

#include <unicode/uchar.h>

#include <array>

namespace moe::tokenizer {
namespace {

uint8_t icu_class(char32_t cp) {
  if (cp > 0x10FFFF) return 0;
  const auto c = static_cast<UChar32>(cp);
  uint8_t f = 0;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER:
      f |= kLetter | kUpperOrCaseless;
      break;
    case U_LOWERCASE_LETTER:
      f |= kLetter | kLowerOrCaseless;
      break;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      f |= kLetter | kUpperOrCaseless | kLowerOrCaseless;
      break;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      f |= kNumber;
      break;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      f |= kMark;
      break;
    default:
      break;
  }
  if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) f |= kSpace;
  if (cp == '\r' || cp == '\n') f |= kCrLf;
  return f;
}

// ASCII dominates real text: answer it from a table instead of calling ICU.
const std::array<uint8_t, 128> kAscii = [] {
  std::array<uint8_t, 128> t{};
  for (char32_t c = 0; c < 128; ++c) t[c] = icu_class(c);
  return t;
}();

}  // namespace

uint8_t char_class(char32_t cp) { return cp < 128 ? kAscii[cp] : icu_class(cp); }

}  // namespace moe::tokenizer
