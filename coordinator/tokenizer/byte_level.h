// GPT-2 byte-level alphabet: every byte maps to one printable code point so that BPE token texts
// are strings. Bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves; the other 68 bytes, in
// increasing order, map to U+0100, U+0101, ... (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace moe::tokenizer {

char32_t byte_to_codepoint(uint8_t b);

// The byte a code point stands for, or -1 if it is not in the alphabet.
int codepoint_to_byte(char32_t cp);

// Raw bytes -> byte-level text (UTF-8).
std::string byte_level_encode(std::string_view bytes);

// Byte-level token text -> raw bytes. Code points outside the alphabet (only in malformed
// vocabularies) are copied through as their UTF-8 rather than dropped.
std::string byte_level_decode(std::string_view text);

}  // namespace moe::tokenizer
