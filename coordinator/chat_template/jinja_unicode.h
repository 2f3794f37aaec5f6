// UTF-8 helpers: Python strings index, slice, measure and strip by code point, not by byte.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moe::jinja {

// Decodes UTF-8; invalid bytes decode as themselves (U+0080..U+00FF) so no input is rejected.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);
bool is_ascii(std::string_view s);

// Python's str.isspace() set (what str.strip() and str.split() without arguments remove).
bool is_py_space(char32_t c);

enum class StripSide { Left, Right, Both };
// str.strip / lstrip / rstrip; `chars` == nullptr means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, StripSide side);

// str.split / str.rsplit. sep == nullptr splits on whitespace runs; maxsplit < 0 means no limit.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, long long maxsplit,
                                  bool from_right);

// ASCII-only case mapping (non-ASCII code points are left unchanged).
std::string ascii_lower(std::string_view s);
std::string ascii_upper(std::string_view s);

}  // namespace moe::jinja
