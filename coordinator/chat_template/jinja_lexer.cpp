#include "coordinator/chat_template/jinja_lexer.h"

#include <cerrno>
#include <cstdlib>

#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {

std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& opt) : s_(src), opt_(opt) {}

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < s_.size()) {
      const size_t tag = find_tag(pos);
      std::string text(s_.substr(pos, tag - pos));
      if (tag == s_.size()) {
        emit_text(std::move(text), pos);
        break;
      }
      const char kind = s_[tag + 1];
      const char mod = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
      const bool at_line_start = pos == 0 || s_[pos - 1] == '\n';
      if (mod == '-') {
        rstrip(text);
      } else if (kind != '{' && mod != '+' && opt_.lstrip_blocks) {
        lstrip_line(text, at_line_start);
      }
      emit_text(std::move(text), pos);
      size_t body = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(tag, body);
      } else if (kind == '%' && is_raw_begin(body)) {
        pos = lex_raw(tag, body);
      } else {
        pos = lex_tag(kind, tag, body);
      }
    }
    tokens_.push_back(Token{TokenType::End, "", s_.size()});
    return std::move(tokens_);
  }

 private:
  // Next "{{", "{%" or "{#" at or after pos; s_.size() when none.
  size_t find_tag(size_t pos) const {
    while (true) {
      const size_t p = s_.find('{', pos);
      if (p == std::string_view::npos || p + 1 >= s_.size()) return s_.size();
      const char c = s_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  static void rstrip(std::string& t) {
    while (!t.empty() && is_ws(t.back())) t.pop_back();
  }

  // lstrip_blocks: drop spaces and tabs between the start of the line and a block/comment tag.
  static void lstrip_line(std::string& t, bool text_at_line_start) {
    const size_t nl = t.rfind('\n');
    if (nl == std::string::npos && !text_at_line_start) return;
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    for (size_t i = from; i < t.size(); ++i)
      if (!is_ws(t[i])) return;
    t.resize(from);
  }

  void emit_text(std::string text, size_t pos) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::Text, std::move(text), pos});
  }

  // After a closing delimiter at `end` (index just past it): "-" strips all following
  // whitespace; otherwise trim_blocks (blocks and comments only) drops one newline.
  size_t after_close(size_t end, char close_mod, bool is_block) const {
    if (close_mod == '-') {
      while (end < s_.size() && is_ws(s_[end])) ++end;
    } else if (close_mod != '+' && is_block && opt_.trim_blocks && end < s_.size() &&
               s_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t lex_comment(size_t tag, size_t body) {
    const size_t close = s_.find("#}", body);
    if (close == std::string_view::npos) fail("unterminated comment", tag);
    const char mod =
        close > body && (s_[close - 1] == '-' || s_[close - 1] == '+') ? s_[close - 1] : '\0';
    return after_close(close + 2, mod, true);
  }

  // Matches "<ws>raw<ws>[-+]%}" after "{%[-+]"; returns the index after "%}" or npos.
  size_t match_keyword_tag(size_t body, std::string_view kw, char* close_mod) const {
    size_t p = body;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    if (s_.substr(p, kw.size()) != kw) return std::string_view::npos;
    p += kw.size();
    if (p < s_.size() && is_name_char(s_[p])) return std::string_view::npos;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    *close_mod = '\0';
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) *close_mod = s_[p++];
    if (s_.substr(p, 2) != "%}") return std::string_view::npos;
    return p + 2;
  }

  bool is_raw_begin(size_t body) const {
    char m;
    return match_keyword_tag(body, "raw", &m) != std::string_view::npos;
  }

  size_t lex_raw(size_t tag, size_t body) {
    char mod;
    size_t pos = match_keyword_tag(body, "raw", &mod);
    if (mod == '-') pos = after_close(pos, '-', true);  // no trim_blocks after {% raw %}
    size_t search = pos;
    while (true) {
      const size_t t = s_.find("{%", search);
      if (t == std::string_view::npos) fail("missing {% endraw %}", tag);
      const char emod = t + 2 < s_.size() ? s_[t + 2] : '\0';
      const size_t ebody = t + 2 + ((emod == '-' || emod == '+') ? 1 : 0);
      char close_mod;
      const size_t end = match_keyword_tag(ebody, "endraw", &close_mod);
      if (end == std::string_view::npos) {
        search = t + 2;
        continue;
      }
      std::string text(s_.substr(pos, t - pos));
      if (emod == '-') {
        rstrip(text);
      } else if (emod != '+' && opt_.lstrip_blocks) {
        lstrip_line(text, pos == 0 || s_[pos - 1] == '\n');
      }
      emit_text(std::move(text), pos);
      return after_close(end, close_mod, true);
    }
  }

  // Expression tokens up to the closing "}}" or "%}" (only outside brackets, like jinja2).
  size_t lex_tag(char kind, size_t tag, size_t p) {
    const bool block = kind == '%';
    tokens_.push_back(Token{block ? TokenType::BlockBegin : TokenType::VarBegin, "", tag});
    const char close_ch = block ? '%' : '}';
    int depth = 0;
    while (true) {
      while (p < s_.size() && is_ws(s_[p])) ++p;
      if (p >= s_.size())
        fail(block ? "unexpected end of template, expected '%}'"
                   : "unexpected end of template, expected '}}'",
             tag);
      if (depth == 0) {
        char close_mod = '\0';
        size_t q = p;
        if ((s_[q] == '-' || (block && s_[q] == '+')) &&
            s_.substr(q + 1, 2) == std::string{close_ch, '}'}) {
          close_mod = s_[q];
          ++q;
        }
        if (s_.substr(q, 2) == std::string{close_ch, '}'}) {
          tokens_.push_back(Token{block ? TokenType::BlockEnd : TokenType::VarEnd, "", p});
          return after_close(q + 2, close_mod, block);
        }
      }
      p = lex_expression_token(p, depth);
    }
  }

  size_t lex_expression_token(size_t p, int& depth) {
    const char c = s_[p];
    if (is_name_start(c)) {
      size_t e = p;
      while (e < s_.size() && is_name_char(s_[e])) ++e;
      tokens_.push_back(Token{TokenType::Name, std::string(s_.substr(p, e - p)), p});
      return e;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwo) {
      if (s_.substr(p, 2) == op) {
        tokens_.push_back(Token{TokenType::Op, std::string(op), p});
        return p + 2;
      }
    }
    if (std::string_view("+-*/%~()[]{}<>=.:|,;").find(c) != std::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      tokens_.push_back(Token{TokenType::Op, std::string(1, c), p});
      return p + 1;
    }
    fail(std::string("unexpected character '") + c + "'", p);
  }

  size_t lex_number(size_t p) {
    const size_t start = p;
    auto digits = [&](size_t q) {
      const size_t b = q;
      while (q < s_.size() && (is_digit(s_[q]) || (s_[q] == '_' && q > b))) ++q;
      return q;
    };
    size_t e = digits(p);
    bool is_float = false;
    // "x.0.1": after an attribute dot only an integer is lexed (jinja2's (?<!\.) rule).
    const bool after_dot = start > 0 && s_[start - 1] == '.';
    if (!after_dot && e + 1 < s_.size() && s_[e] == '.' && is_digit(s_[e + 1])) {
      is_float = true;
      e = digits(e + 1);
    }
    if (!after_dot && e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t q = e + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && is_digit(s_[q])) {
        is_float = true;
        e = digits(q);
      }
    }
    std::string text;
    for (size_t i = start; i < e; ++i)
      if (s_[i] != '_') text += s_[i];
    Token t{is_float ? TokenType::Float : TokenType::Int, text, start};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail("integer literal out of range", start);
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  // Python string-literal escapes (jinja2 decodes literals with "unicode-escape").
  size_t lex_string(size_t p) {
    const char quote = s_[p];
    std::string out;
    size_t i = p + 1;
    while (true) {
      if (i >= s_.size()) fail("unterminated string literal", p);
      const char c = s_[i];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= s_.size()) fail("unterminated string literal", p);
      const char e = s_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = i < s_.size() ? hex_value(s_[i]) : -1;
            if (h < 0) fail("truncated \\" + std::string(1, e) + " escape in string literal", p);
            cp = cp * 16 + static_cast<char32_t>(h);
            ++i;
          }
          if (cp > 0x10FFFF) fail("invalid \\U escape in string literal", p);
          utf8_append(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; ++k, ++i)
              cp = cp * 8 + static_cast<char32_t>(s_[i] - '0');
            utf8_append(out, cp);
          } else {  // unknown escapes keep the backslash, as Python does
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(Token{TokenType::String, std::move(out), p});
    return i + 1;
  }

  std::string_view s_;
  LexOptions opt_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& opt) {
  return Lexer(source, opt).run();
}

}  // namespace moe::jinja
