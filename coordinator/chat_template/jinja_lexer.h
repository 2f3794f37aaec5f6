// Splits a template into text and tag tokens, applying jinja2's whitespace control exactly:
// `{%-`/`-%}` (and `{{-`, `{#-` ...), trim_blocks, lstrip_blocks, `{%+`/`+%}`, raw blocks and
// comments. Inside tags it produces expression tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe::jinja {

enum class TokenType {
  Text,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  End
};

struct Token {
  TokenType type;
  std::string value;  // text, name, decoded string literal or operator
  size_t pos;         // byte offset in the (newline-normalized) source
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Converts "\r\n" and "\r" to "\n" and removes one trailing newline, as jinja2 does with its
// default newline_sequence and keep_trailing_newline=False.
std::string normalize_source(std::string_view source);

// Throws jinja::Error on unterminated tags, comments, strings or unknown characters.
std::vector<Token> tokenize(std::string_view source, const LexOptions& opt);

}  // namespace moe::jinja
