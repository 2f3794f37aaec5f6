// jinja2's builtin filters (the subset chat templates use), plus HF's `tojson`
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)).
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "coordinator/chat_template/jinja_builtins.h"
#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_json.h"
#include "coordinator/chat_template/jinja_limits.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {
namespace {

int64_t int_param(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value v = a.get(i, name);
  if (v.is_undefined() || v.is_none()) return dflt;
  if (!v.is_int() && !v.is_bool()) fail("'" + std::string(name) + "' must be an integer");
  return v.as_int();
}

// "a.b.0" attribute paths of map/selectattr/sort(attribute=...): each part is an item lookup,
// numeric parts index lists (jinja2's make_attrgetter).
Value lookup_path(const Value& item, const Value& path) {
  if (path.is_int()) return get_item(item, path);
  const std::string p = to_str(path);
  Value cur = item;
  size_t b = 0;
  while (true) {
    const size_t e = p.find('.', b);
    const std::string part = p.substr(b, e == std::string::npos ? std::string::npos : e - b);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric && part.size() < 18 ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part))))
                                      : get_item(cur, Value(part));
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

Value f_abs(const Value& v, const CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  fail("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(const Value& v, const CallArgs& a) {
  const std::string name = to_str(a.get(0, "name"));
  if (v.is_dict()) return dict_method(v, name);
  if (v.is_string()) return string_method(v, name);
  return get_attr(v, name);
}

Value f_capitalize(const Value& v, const CallArgs&) {
  std::string s = ascii_lower(to_str(v));
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 32);
  return Value(std::move(s));
}

Value f_default(const Value& v, const CallArgs& a) {
  const bool boolean = a.get(1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
  return v;
}

Value f_escape(const Value& v, const CallArgs&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  charge_string(out.size());
  return Value(std::move(out));
}

Value f_first(const Value& v, const CallArgs&) {
  if (v.is_list())
    return v.as_list().empty() ? Value::undefined("No first item, sequence was empty.")
                               : v.as_list().front();
  const List l = iterate(v);
  return l.empty() ? Value::undefined("No first item, sequence was empty.") : l.front();
}

Value f_last(const Value& v, const CallArgs&) {
  if (v.is_list())
    return v.as_list().empty() ? Value::undefined("No last item, sequence was empty.")
                               : v.as_list().back();
  const List l = iterate(v);
  return l.empty() ? Value::undefined("No last item, sequence was empty.") : l.back();
}

// Python float(str): surrounding whitespace allowed, "inf"/"nan" accepted, nothing else trailing.
bool parse_float(const std::string& s, double* out) {
  const std::string t = py_strip(s, nullptr, StripSide::Both);
  if (t.empty()) return false;
  std::string clean;
  for (char c : t)
    if (c != '_') clean += c;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size() && clean.find_first_of("xXpP") == std::string::npos;
}

Value f_float(const Value& v, const CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.as_string(), &d)) return Value(d);
  return dflt;
}

Value f_int(const Value& v, const CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(int64_t{0}));
  const int64_t base = int_param(a, 1, "base", 10);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value(static_cast<int64_t>(d));
  }
  if (!v.is_string()) return dflt;
  std::string t;
  for (char c : py_strip(v.as_string(), nullptr, StripSide::Both))
    if (c != '_') t += c;
  if (!t.empty() && base >= 2 && base <= 36) {
    errno = 0;
    char* end = nullptr;
    const long long r = std::strtoll(t.c_str(), &end, static_cast<int>(base));
    if (end == t.c_str() + t.size() && errno == 0) return Value(static_cast<int64_t>(r));
  }
  double d;  // jinja2 falls back to int(float(value))
  if (parse_float(v.as_string(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
    return Value(static_cast<int64_t>(d));
  return dflt;
}

Value f_items(const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.as_dict().entries) out.emplace_back(List{Value(k), x}, true);
  return Value(std::move(out));
}

Value f_join(const Value& v, const CallArgs& a) {
  const std::string sep = to_str(a.get(0, "d", Value("")));
  const Value attribute = a.get(1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute.is_none() ? item : lookup_path(item, attribute));
    check_size(out.size());
  }
  charge_string(out.size());
  return Value(std::move(out));
}

Value f_length(const Value& v, const CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return Value(int64_t{0});
    case Value::Kind::String:
      return Value(static_cast<int64_t>(utf8_length(v.as_string())));
    case Value::Kind::List:
      return Value(static_cast<int64_t>(v.as_list().size()));
    case Value::Kind::Dict:
      return Value(static_cast<int64_t>(v.as_dict().entries.size()));
    default:
      fail("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_list(const Value& v, const CallArgs&) { return Value(iterate(v)); }
Value f_lower(const Value& v, const CallArgs&) { return Value(ascii_lower(to_str(v))); }
Value f_upper(const Value& v, const CallArgs&) { return Value(ascii_upper(to_str(v))); }

Value f_indent(const Value& v, const CallArgs& a) {
  const Value w = a.get(0, "width", Value(int64_t{4}));
  std::string ind;
  if (w.is_string()) {
    ind = w.as_string();
  } else {
    const int64_t n = w.as_int();
    if (n > 1000) fail("indent width too large");
    ind = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  }
  const bool first = a.get(1, "first").truthy();
  const bool blank = a.get(2, "blank").truthy();
  // jinja2 appends "\n" and then uses splitlines(), so a trailing newline is kept.
  std::vector<std::string> lines;
  const std::string s = to_str(v) + "\n";
  size_t b = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    lines.push_back(s.substr(b, i - b));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    b = i + 1;
  }
  if (b < s.size()) lines.push_back(s.substr(b));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    if (i > 0 && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
    check_size(out.size());
  }
  if (first) out = ind + out;
  charge_string(out.size());
  return Value(std::move(out));
}

Value f_replace(const Value& v, const CallArgs& a) {
  const Value count = a.get(2, "count", Value::none());
  return Value(py_replace(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                          count.is_none() ? -1 : count.as_int()));
}

Value f_reverse(const Value& v, const CallArgs&) {
  if (v.is_string()) {
    std::u32string s = utf8_decode(v.as_string());
    std::reverse(s.begin(), s.end());
    return Value(utf8_encode(s));
  }
  List l = iterate(v);
  std::reverse(l.begin(), l.end());
  return Value(std::move(l));
}

// Python round(): ties to even on the exact binary value; printf rounds the same way.
Value f_round(const Value& v, const CallArgs& a) {
  const int64_t precision = int_param(a, 0, "precision", 0);
  const std::string method = to_str(a.get(1, "method", Value("common")));
  if (precision < -300 || precision > 300) fail("round precision out of range");
  if (method == "common") {
    if (v.is_int() || v.is_bool()) {
      if (precision >= 0) return Value(v.as_int());
    }
    const double x = v.as_double();
    if (!std::isfinite(x)) return Value(x);
    if (precision >= 0) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(precision, 100)),
                    x);
      return Value(std::strtod(buf, nullptr));
    }
    const double p = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(x / p) * p);
  }
  if (method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * p;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_safe(const Value& v, const CallArgs&) { return v.is_string() ? v : Value(to_str(v)); }
Value f_string(const Value& v, const CallArgs&) { return v.is_string() ? v : Value(to_str(v)); }

Value f_title(const Value& v, const CallArgs&) {
  // jinja2: split at runs of [-\s({[<], capitalize each piece (first upper, rest lower).
  const std::string s = to_str(v);
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool sep = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
                     c == '\v' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      word_start = true;
      continue;
    }
    if (c >= 'a' && c <= 'z' && word_start)
      c = static_cast<char>(c - 32);
    else if (c >= 'A' && c <= 'Z' && !word_start)
      c = static_cast<char>(c + 32);
    out += c;
    word_start = false;
  }
  return Value(std::move(out));
}

Value f_tojson(const Value& v, const CallArgs& a) {
  DumpOptions opt;
  opt.ensure_ascii = a.get(0, "ensure_ascii", Value(false)).truthy();
  const Value indent = a.get(1, "indent", Value::none());
  if (indent.is_string()) {
    opt.indent = indent.as_string();
  } else if (indent.is_int()) {
    if (indent.as_int() > 1000) fail("indent too large");
    opt.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  } else if (!indent.is_none() && !indent.is_undefined()) {
    fail("tojson indent must be an integer or a string");
  }
  if (opt.indent) opt.item_separator = ",";
  const Value seps = a.get(2, "separators", Value::none());
  if (seps.is_list()) {
    if (seps.as_list().size() != 2) fail("tojson separators must be a pair");
    opt.item_separator = to_str(seps.as_list()[0]);
    opt.key_separator = to_str(seps.as_list()[1]);
  }
  opt.sort_keys = a.get(3, "sort_keys", Value(false)).truthy();
  return Value(dumps(v, opt));
}

Value f_trim(const Value& v, const CallArgs& a) {
  const Value chars = a.get(0, "chars", Value::none());
  std::string cs;
  if (!chars.is_none() && !chars.is_undefined()) cs = to_str(chars);
  return Value(py_strip(to_str(v), chars.is_none() || chars.is_undefined() ? nullptr : &cs,
                        StripSide::Both));
}

Value f_wordcount(const Value& v, const CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(to_str(v))) {
    const bool w = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '_' || (c >= 0x80 && !is_py_space(c));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_format(const Value& v, const CallArgs& a) {
  if (!a.positional.empty() && !a.kwargs.empty())
    fail("can't handle positional and keyword arguments at the same time");
  if (!a.kwargs.empty()) fail("format with keyword arguments is not supported");
  return Value(percent_format(to_str(v), Value(a.positional, true)));
}

// Sort key: strings compare case-insensitively unless case_sensitive.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  Value k = attribute.is_none() || attribute.is_undefined() ? item : lookup_path(item, attribute);
  if (!case_sensitive && k.is_string()) return Value(ascii_lower(k.as_string()));
  return k;
}

Value f_sort(const Value& v, const CallArgs& a) {
  const bool reverse = a.get(0, "reverse").truthy();
  const bool cs = a.get(1, "case_sensitive").truthy();
  const Value attribute = a.get(2, "attribute", Value::none());
  List items = iterate(v);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i)
    keyed.emplace_back(sort_key(items[i], attribute, cs), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  List out;
  for (const auto& k : keyed) out.push_back(items[k.second]);
  return Value(std::move(out));
}

Value f_dictsort(const Value& v, const CallArgs& a) {
  if (!v.is_dict()) fail("dictsort filter requires a mapping");
  const bool cs = a.get(0, "case_sensitive").truthy();
  const std::string by = to_str(a.get(1, "by", Value("key")));
  const bool reverse = a.get(2, "reverse").truthy();
  const size_t pos = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (pos == 2) fail("You can only sort by either \"key\" or \"value\"");
  List pairs;
  for (const auto& [k, x] : v.as_dict().entries) pairs.emplace_back(List{Value(k), x}, true);
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.as_list()[pos], Value::none(), cs);
    const Value ky = sort_key(y.as_list()[pos], Value::none(), cs);
    return reverse ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
  });
  return Value(std::move(pairs));
}

Value f_unique(const Value& v, const CallArgs& a) {
  const bool cs = a.get(0, "case_sensitive").truthy();
  const Value attribute = a.get(1, "attribute", Value::none());
  List out, seen;
  for (const Value& item : iterate(v)) {
    Value k = sort_key(item, attribute, cs);
    bool dup = false;
    for (const Value& s : seen) {
      if (equals(s, k)) {
        dup = true;
        break;
      }
    }
    if (!dup) {
      seen.push_back(std::move(k));
      out.push_back(item);
    }
  }
  return Value(std::move(out));
}

Value min_max(const Value& v, const CallArgs& a, bool want_max) {
  const bool cs = a.get(0, "case_sensitive").truthy();
  const Value attribute = a.get(1, "attribute", Value::none());
  const List items = iterate(v);
  if (items.empty())
    return Value::undefined(want_max ? "No aggregated item, sequence was empty."
                                     : "No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(sort_key(items[i], attribute, cs), sort_key(items[best], attribute, cs));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
Value f_min(const Value& v, const CallArgs& a) { return min_max(v, a, false); }
Value f_max(const Value& v, const CallArgs& a) { return min_max(v, a, true); }

Value f_sum(const Value& v, const CallArgs& a) {
  const Value attribute = a.get(0, "attribute", Value::none());
  Value total = a.get(1, "start", Value(int64_t{0}));
  for (const Value& item : iterate(v))
    total = binary_op("+", total, attribute.is_none() ? item : lookup_path(item, attribute));
  return total;
}

// map(attribute='x', default=...) or map('filter', args...).
Value f_map(const Value& v, const CallArgs& a) {
  List out;
  const List items = iterate(v);
  if (const Value* attribute = a.find_kwarg("attribute")) {
    const Value* dflt = a.find_kwarg("default");
    for (const Value& item : items) {
      Value x = lookup_path(item, *attribute);
      out.push_back(x.is_undefined() && dflt ? *dflt : x);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty()) fail("map requires a filter name or attribute=");
  const std::string name = to_str(a.positional[0]);
  FilterFn f = find_filter(name);
  if (!f) fail("No filter named '" + name + "'");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.kwargs = a.kwargs;
  for (const Value& item : items) {
    charge_step();
    out.push_back(f(item, rest));
  }
  return Value(std::move(out));
}

// select/reject/selectattr/rejectattr (jinja2's select_or_reject).
Value select_impl(const Value& v, const CallArgs& a, bool by_attr, bool keep_when) {
  size_t off = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) fail("missing attribute for selectattr/rejectattr");
    attribute = a.positional[0];
    off = 1;
  }
  TestFn test = nullptr;
  CallArgs targs;
  if (a.positional.size() > off) {
    const std::string name = to_str(a.positional[off]);
    test = find_test(name);
    if (!test) fail("No test named '" + name + "'");
    targs.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(off) + 1,
                            a.positional.end());
    targs.kwargs = a.kwargs;
  }
  List out;
  for (const Value& item : iterate(v)) {
    charge_step();
    const Value x = by_attr ? lookup_path(item, attribute) : item;
    const bool r = test ? test(x, targs) : x.truthy();
    if (r == keep_when) out.push_back(item);
  }
  return Value(std::move(out));
}
Value f_select(const Value& v, const CallArgs& a) { return select_impl(v, a, false, true); }
Value f_reject(const Value& v, const CallArgs& a) { return select_impl(v, a, false, false); }
Value f_selectattr(const Value& v, const CallArgs& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, const CallArgs& a) { return select_impl(v, a, true, false); }

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const FilterEntry& f : kFilters)
    if (f.name == name) return f.fn;
  return nullptr;
}

}  // namespace moe::jinja
