// The str and dict methods templates call (`s.startswith(...)`, `d.items()` ...). Mutating
// methods (list.append, dict.update ...) are absent on purpose: HF renders with jinja2's
// ImmutableSandboxedEnvironment, which forbids them too.
#include <algorithm>

#include "coordinator/chat_template/jinja_builtins.h"
#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_limits.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {
namespace {

using Method = Value (*)(const Value& self, const CallArgs& args);

const std::string& str_arg(const CallArgs& a, size_t i, std::string_view name, const char* method) {
  const Value* v = i < a.positional.size() ? &a.positional[i] : a.find_kwarg(name);
  if (!v || !v->is_string()) {
    fail(std::string(method) + "() argument '" + std::string(name) + "' must be str");
  }
  return v->as_string();
}

// Optional string argument (None/absent -> nullptr).
const std::string* opt_str_arg(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = i < a.positional.size() ? &a.positional[i] : a.find_kwarg(name);
  if (!v || v->is_none() || v->is_undefined()) return nullptr;
  if (!v->is_string()) fail("expected a string argument, got " + v->type_name());
  return &v->as_string();
}

int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value v = a.get(i, name);
  if (v.is_undefined() || v.is_none()) return dflt;
  if (!v.is_int() && !v.is_bool()) fail("expected an integer argument, got " + v.type_name());
  return v.as_int();
}

// startswith/endswith accept a string or a tuple of strings, plus optional start/end.
Value affix_test(const Value& self, const CallArgs& a, bool prefix) {
  const Value needle = a.get(0, "prefix");
  std::u32string s = utf8_decode(self.as_string());
  const auto len = static_cast<int64_t>(s.size());
  auto clamp = [&](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + len : i, 0, len); };
  const int64_t b = clamp(int_arg(a, 1, "start", 0)), e = clamp(int_arg(a, 2, "end", len));
  if (b > e) return Value(false);
  s = s.substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
  const std::string sub = utf8_encode(s);
  auto test = [&](const Value& n) {
    if (!n.is_string()) fail("startswith/endswith first arg must be str or a tuple of str");
    const std::string& x = n.as_string();
    if (x.size() > sub.size()) return false;
    return prefix ? sub.compare(0, x.size(), x) == 0
                  : sub.compare(sub.size() - x.size(), x.size(), x) == 0;
  };
  if (needle.is_list()) {
    for (const Value& n : needle.as_list())
      if (test(n)) return Value(true);
    return Value(false);
  }
  return Value(test(needle));
}

Value m_startswith(const Value& s, const CallArgs& a) { return affix_test(s, a, true); }
Value m_endswith(const Value& s, const CallArgs& a) { return affix_test(s, a, false); }
Value m_strip(const Value& s, const CallArgs& a) {
  return Value(py_strip(s.as_string(), opt_str_arg(a, 0, "chars"), StripSide::Both));
}
Value m_lstrip(const Value& s, const CallArgs& a) {
  return Value(py_strip(s.as_string(), opt_str_arg(a, 0, "chars"), StripSide::Left));
}
Value m_rstrip(const Value& s, const CallArgs& a) {
  return Value(py_strip(s.as_string(), opt_str_arg(a, 0, "chars"), StripSide::Right));
}

Value split_impl(const Value& s, const CallArgs& a, bool right) {
  List out;
  for (auto& part :
       py_split(s.as_string(), opt_str_arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1), right))
    out.emplace_back(std::move(part));
  if (Budget* b = ActiveBudget::get()) b->list_items(out.size());
  return Value(std::move(out));
}
Value m_split(const Value& s, const CallArgs& a) { return split_impl(s, a, false); }
Value m_rsplit(const Value& s, const CallArgs& a) { return split_impl(s, a, true); }

Value m_splitlines(const Value& s, const CallArgs& a) {
  const bool keep = a.get(0, "keepends").truthy();
  List out;
  const std::string& str = s.as_string();
  size_t b = 0;
  for (size_t i = 0; i < str.size(); ++i) {
    if (str[i] != '\n' && str[i] != '\r') continue;
    size_t e = i + 1;
    if (str[i] == '\r' && e < str.size() && str[e] == '\n') ++e;
    out.emplace_back(str.substr(b, (keep ? e : i) - b));
    b = e;
    i = e - 1;
  }
  if (b < str.size()) out.emplace_back(str.substr(b));
  return Value(std::move(out));
}

}  // namespace

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    int64_t done = 0;
    for (char32_t c : utf8_decode(s)) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      utf8_append(out, c);
      check_size(out.size());
    }
    if (count < 0 || done < count) out += repl;
  } else {
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      const size_t hit = s.find(old, pos);
      if (hit == std::string::npos) break;
      out.append(s, pos, hit - pos);
      out += repl;
      check_size(out.size());
      pos = hit + old.size();
      ++done;
    }
    out.append(s, pos);
  }
  charge_string(out.size());
  return out;
}

namespace {

Value m_replace(const Value& s, const CallArgs& a) {
  return Value(py_replace(s.as_string(), str_arg(a, 0, "old", "replace"),
                          str_arg(a, 1, "new", "replace"), int_arg(a, 2, "count", -1)));
}
Value m_upper(const Value& s, const CallArgs&) { return Value(ascii_upper(s.as_string())); }
Value m_lower(const Value& s, const CallArgs&) { return Value(ascii_lower(s.as_string())); }

bool is_ascii_alpha(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python str.title(): a letter after a non-letter starts a word.
Value m_title(const Value& s, const CallArgs&) {
  std::string out;
  bool prev_letter = false;
  for (char32_t c : utf8_decode(s.as_string())) {
    const bool letter = is_ascii_alpha(c) || c >= 0x80;
    if (c < 0x80 && is_ascii_alpha(c)) c = prev_letter ? (c | 0x20) : (c & ~char32_t{0x20});
    utf8_append(out, c);
    prev_letter = letter;
  }
  return Value(std::move(out));
}

Value m_capitalize(const Value& s, const CallArgs&) {
  std::string out = ascii_lower(s.as_string());
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return Value(std::move(out));
}

// find/rfind/index/count on code point offsets.
int64_t find_impl(const Value& s, const CallArgs& a, bool reverse, const char* name) {
  const std::u32string hay = utf8_decode(s.as_string());
  const std::u32string needle = utf8_decode(str_arg(a, 0, "sub", name));
  const auto len = static_cast<int64_t>(hay.size());
  auto clamp = [&](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + len : i, 0, len); };
  const int64_t b = clamp(int_arg(a, 1, "start", 0)), e = clamp(int_arg(a, 2, "end", len));
  if (e - b < static_cast<int64_t>(needle.size())) return -1;
  const std::u32string_view window =
      std::u32string_view(hay).substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
  const size_t hit = reverse ? window.rfind(needle) : window.find(needle);
  return hit == std::u32string_view::npos ? -1 : b + static_cast<int64_t>(hit);
}
Value m_find(const Value& s, const CallArgs& a) { return Value(find_impl(s, a, false, "find")); }
Value m_rfind(const Value& s, const CallArgs& a) { return Value(find_impl(s, a, true, "rfind")); }
Value m_index(const Value& s, const CallArgs& a) {
  const int64_t i = find_impl(s, a, false, "index");
  if (i < 0) fail("substring not found");
  return Value(i);
}

Value m_count(const Value& s, const CallArgs& a) {
  const std::string& sub = str_arg(a, 0, "sub", "count");
  const std::string& str = s.as_string();
  if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(str) + 1));
  int64_t n = 0;
  for (size_t pos = str.find(sub); pos != std::string::npos; pos = str.find(sub, pos + sub.size()))
    ++n;
  return Value(n);
}

Value m_join(const Value& s, const CallArgs& a) {
  std::string out;
  bool first = true;
  for (const Value& v : iterate(a.get(0, "iterable"))) {
    if (!v.is_string()) fail("sequence item: expected str instance, " + v.type_name() + " found");
    if (!first) out += s.as_string();
    first = false;
    out += v.as_string();
    check_size(out.size());
  }
  charge_string(out.size());
  return Value(std::move(out));
}

template <bool (*Pred)(char32_t)>
Value char_class(const Value& s, const CallArgs&) {
  const std::u32string cs = utf8_decode(s.as_string());
  return Value(!cs.empty() && std::all_of(cs.begin(), cs.end(), Pred));
}
bool is_digit32(char32_t c) { return c >= '0' && c <= '9'; }
bool is_alpha32(char32_t c) { return is_ascii_alpha(c); }
bool is_alnum32(char32_t c) { return is_ascii_alpha(c) || is_digit32(c); }

Value m_removeprefix(const Value& s, const CallArgs& a) {
  const std::string& p = str_arg(a, 0, "prefix", "removeprefix");
  const std::string& str = s.as_string();
  return Value(str.compare(0, p.size(), p) == 0 ? str.substr(p.size()) : str);
}
Value m_removesuffix(const Value& s, const CallArgs& a) {
  const std::string& p = str_arg(a, 0, "suffix", "removesuffix");
  const std::string& str = s.as_string();
  if (!p.empty() && str.size() >= p.size() && str.compare(str.size() - p.size(), p.size(), p) == 0)
    return Value(str.substr(0, str.size() - p.size()));
  return s;
}

// str.format with "{}", "{0}", "{name}" and "{{"/"}}"; format specs are not supported.
Value m_format(const Value& s, const CallArgs& a) {
  const std::string& f = s.as_string();
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}')
        ++i;
      else
        fail("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    const std::string field = f.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos)
      fail("format specs in str.format are not supported");
    Value v;
    if (field.empty()) {
      if (auto_index >= a.positional.size()) fail("Replacement index out of range");
      v = a.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t k = std::stoul(field);
      if (k >= a.positional.size()) fail("Replacement index out of range");
      v = a.positional[k];
    } else {
      const Value* kw = a.find_kwarg(field);
      if (!kw) fail("KeyError: '" + field + "'");
      v = *kw;
    }
    out += to_str(v);
    check_size(out.size());
    i = close;
  }
  charge_string(out.size());
  return Value(std::move(out));
}

// dict methods
Value m_items(const Value& d, const CallArgs&) {
  List out;
  for (const auto& [k, v] : d.as_dict().entries) out.emplace_back(List{Value(k), v}, true);
  return Value(std::move(out));
}
Value m_keys(const Value& d, const CallArgs&) {
  List out;
  for (const auto& e : d.as_dict().entries) out.emplace_back(e.first);
  return Value(std::move(out));
}
Value m_values(const Value& d, const CallArgs&) {
  List out;
  for (const auto& e : d.as_dict().entries) out.push_back(e.second);
  return Value(std::move(out));
}
Value m_get(const Value& d, const CallArgs& a) {
  const Value key = a.get(0, "key");
  if (key.is_string()) {
    if (const Value* v = d.as_dict().find(key.as_string())) return *v;
  }
  return a.get(1, "default", Value::none());
}

struct MethodEntry {
  std::string_view name;
  Method fn;
};

constexpr MethodEntry kStringMethods[] = {
    {"startswith", m_startswith},
    {"endswith", m_endswith},
    {"strip", m_strip},
    {"lstrip", m_lstrip},
    {"rstrip", m_rstrip},
    {"split", m_split},
    {"rsplit", m_rsplit},
    {"splitlines", m_splitlines},
    {"replace", m_replace},
    {"upper", m_upper},
    {"lower", m_lower},
    {"title", m_title},
    {"capitalize", m_capitalize},
    {"find", m_find},
    {"rfind", m_rfind},
    {"index", m_index},
    {"count", m_count},
    {"join", m_join},
    {"format", m_format},
    {"isdigit", char_class<is_digit32>},
    {"isalpha", char_class<is_alpha32>},
    {"isalnum", char_class<is_alnum32>},
    {"isspace", char_class<is_py_space>},
    {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix},
};

constexpr MethodEntry kDictMethods[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get}};

template <size_t N>
Value bind(const Value& self, const std::string& name, const MethodEntry (&table)[N]) {
  for (const MethodEntry& m : table) {
    if (m.name == name) {
      Method fn = m.fn;
      return Value(Function{name, [self, fn](CallArgs& args) { return fn(self, args); }});
    }
  }
  return Value();
}

}  // namespace

Value string_method(const Value& self, const std::string& name) {
  return bind(self, name, kStringMethods);
}
Value dict_method(const Value& self, const std::string& name) {
  return bind(self, name, kDictMethods);
}

}  // namespace moe::jinja
