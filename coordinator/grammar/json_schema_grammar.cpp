#include "coordinator/grammar/json_schema_grammar.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace moe::grammar {

namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxSchemaDepth = 64;
constexpr size_t kMaxRules = 4096;
constexpr int64_t kMaxRepeat = 10000;
constexpr int kAnyValueDepth = 20;               // arrays/objects nested in a free-form value
constexpr int64_t kIntLimit = 9999999999999999;  // the largest 16-digit integer

// clang-format off
// Keywords that constrain a value (everything else is an annotation or unknown: ignored).
const std::set<std::string, std::less<>> kConstraints = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref"};

// Constraints the grammar cannot express: refused by name rather than ignored (ignoring one would
// let the model write what the schema forbids).
const std::set<std::string, std::less<>> kRefused = {
    "pattern", "patternProperties", "propertyNames", "minProperties", "maxProperties",
    "dependencies", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
    "unevaluatedItems", "contains", "minContains", "maxContains", "uniqueItems", "multipleOf",
    "not", "if", "then", "else", "$dynamicRef", "$recursiveRef"};

// Keywords that only apply to one type (a schema without `type` that has one is a union).
const std::set<std::string, std::less<>> kTypeKeywords = {
    "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "minLength", "maxLength", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum"};
// clang-format on

// The JSON string characters, as GBNF: anything but '"', '\' and controls, or an escape.
constexpr std::string_view kCharRule =
    R"([^\x22\x5C\x00-\x1F] | "\\" ( [\x22\x5C/bfnrt] | "u" [0-9a-fA-F]{4} ))";
// Keys of additional properties: no \u and no \/, so the text of a key is its only spelling.
constexpr std::string_view kKeyCharRule = R"([^\x22\x5C\x00-\x1F] | "\\" [\x22\x5Cbfnrt])";

std::string hex_escape(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", c);
  return buf;
}

// A GBNF literal of UTF-8 text.
std::string lit(std::string_view bytes) {
  std::string out = "\"";
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\' || c < 0x20 || c == 0x7F) {
      out += hex_escape(c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// One character (a UTF-8 sequence) inside a GBNF class: ASCII punctuation as \xHH (never a range
// dash, caret or bracket), letters, digits and non-ASCII as they are.
std::string class_char(std::string_view ch) {
  const auto c = static_cast<unsigned char>(ch[0]);
  if (c >= 0x80 || std::isalnum(c)) return std::string(ch);
  return hex_escape(c);
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string seq(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (const auto p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

std::string group(const std::vector<std::string>& alts) { return "(" + join(alts, " | ") + ")"; }

// The GBNF postfix for {min,max}; max < 0: unbounded.
std::string repeat(int64_t min, int64_t max) {
  if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}";
  if (min == 0 && max == 1) return "?";
  if (min == max) return "{" + std::to_string(min) + "}";
  return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

// `item` (one name or group) repeated min..max times. The engine makes a rule per optional copy,
// so a long optional span is written as blocks of 100 and a rest of at most 99 (about 300 rules
// for 10,000, each count still read one way).
std::string repeated(const std::string& item, int64_t min, int64_t max) {
  if (max < 0 || max - min <= 128) return item + repeat(min, max);
  const int64_t span = max - min, q = span / 100, r = span % 100;
  const std::string block = "(" + item + "{100})";
  // 100k + t more: k < q with any t <= 99, or k = q with t <= r.
  std::string fewer = item + "{0,99}";
  if (q > 1) fewer = block + repeat(0, q - 1) + " " + fewer;
  std::string most = block + repeat(q, q);
  if (r > 0) most += " " + item + repeat(0, r);
  return seq({min > 0 ? item + repeat(min, min) : "", "(" + fewer + " | " + most + ")"});
}

std::string escape_pointer_token(std::string_view key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& ptr, const std::string& what) {
  throw Error("json_schema: #" + ptr + ": " + what);
}

// --- integer ranges as digit strings --------------------------------------------------------

std::string any_digits(size_t n) {
  return n == 0 ? "" : n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}";
}

std::string digit_class(char a, char b) {
  return a == b ? lit(std::string(1, a)) : std::string("[") + a + "-" + b + "]";
}

// The digit strings of lo's length between lo and hi (lo <= hi, same length).
std::string same_length_range(const std::string& lo, const std::string& hi) {
  size_t p = 0;
  while (p < lo.size() && lo[p] == hi[p]) ++p;
  const std::string prefix = p ? lit(lo.substr(0, p)) : "";
  if (p == lo.size()) return prefix;
  const char a = lo[p], b = hi[p];
  const std::string rl = lo.substr(p + 1), rh = hi.substr(p + 1);
  const size_t n = rl.size();
  const bool lo_zeros = std::all_of(rl.begin(), rl.end(), [](char c) { return c == '0'; });
  const bool hi_nines = std::all_of(rh.begin(), rh.end(), [](char c) { return c == '9'; });
  std::vector<std::string> alts;
  if (!lo_zeros)
    alts.push_back(seq({lit(std::string(1, a)), same_length_range(rl, std::string(n, '9'))}));
  const char from = lo_zeros ? a : static_cast<char>(a + 1);
  const char to = hi_nines ? b : static_cast<char>(b - 1);
  if (from <= to) alts.push_back(seq({digit_class(from, to), any_digits(n)}));
  if (!hi_nines)
    alts.push_back(seq({lit(std::string(1, b)), same_length_range(std::string(n, '0'), rh)}));
  return seq({prefix, group(alts)});
}

// Decimal numbers in [lo, hi] without leading zeros (0 <= lo <= hi).
std::string unsigned_range(uint64_t lo, uint64_t hi) {
  const std::string ls = std::to_string(lo), hs = std::to_string(hi);
  std::vector<std::string> alts;
  for (size_t d = ls.size(); d <= hs.size(); ++d) {
    std::string a = ls;
    if (d != ls.size()) a = std::string(1, '1').append(d - 1, '0');
    const std::string b = d == hs.size() ? hs : std::string(d, '9');
    alts.push_back(same_length_range(a, b));
  }
  return group(alts);
}

std::string integer_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) {
    const uint64_t mlo = hi < 0 ? static_cast<uint64_t>(-hi) : 1;
    alts.push_back(seq({"\"-\"", unsigned_range(mlo, static_cast<uint64_t>(-lo))}));
  }
  if (hi >= 0)
    alts.push_back(
        unsigned_range(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi)));
  return group(alts);
}

bool has_type(const Json& v, std::string_view t) {
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

class Converter {
 public:
  Converter(const Json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {
    for (const char c : prefix_) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') {
        throw Error("json_schema: rule prefix '" + prefix_ +
                    "' may hold only letters, digits and '-'");
      }
    }
  }

  std::string schema_root() {
    const std::string name = reserve_exact("root");
    ref_rules_["#"] = name;  // "$ref": "#" is the root rule itself
    left_refs_.insert("#");
    define(name, visit(root_, "", 0));
    return text();
  }

  std::string object_root() {
    define(reserve_exact("root"), any_object_body(kAnyValueDepth - 1));
    return text();
  }

 private:
  std::string text() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

  // --- rules ---

  std::string reserve_exact(const std::string& base) {
    if (rules_.size() >= kMaxRules) {
      fail("", "the schema needs more than " + std::to_string(kMaxRules) + " grammar rules");
    }
    const std::string name = prefix_ + base;
    index_[name] = rules_.size();
    rules_.emplace_back(name, "");
    return name;
  }

  // A fresh rule name readable after `hint` (a property name, a $defs entry).
  std::string reserve(std::string_view hint) {
    std::string base;
    for (const char c : hint.substr(0, 24)) {
      base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    }
    if (base.empty()) base = "r";
    return reserve_exact(base + "-" + std::to_string(counter_++));
  }

  void define(const std::string& name, std::string body) {
    rules_[index_.at(name)].second = std::move(body);
  }

  std::string add_rule(std::string_view hint, std::string body) {
    const std::string name = reserve(hint);
    define(name, std::move(body));
    return name;
  }

  // A rule name for `expr` when it is more than one name (repetitions copy their item).
  std::string as_rule(std::string_view hint, const std::string& expr) {
    const bool simple = expr.find_first_of(" |()[\"") == std::string::npos;
    return simple ? expr : add_rule(hint, expr);
  }

  // Shared rules, written the first time they are used.
  std::string prim(const std::string& which) {
    const std::string name = prefix_ + which;
    if (index_.count(name)) return name;
    reserve_exact(which);
    define(name, prim_body(which));
    return name;
  }

  std::string prim_body(const std::string& which) {
    if (which == "ws") return R"("\n"? [ \t]{0,20})";
    if (which == "char") return std::string(kCharRule);
    if (which == "key-char") return std::string(kKeyCharRule);
    if (which == "string") return seq({R"("\"")", prim("char") + "*", R"("\"")"});
    if (which == "integer") return R"("-"? ("0" | [1-9] [0-9]{0,15}))";
    if (which == "number") {
      return prim("integer") + R"( ("." [0-9]{1,16})? ([eE] ("-" | "+")? [0-9]{1,3})?)";
    }
    if (which == "boolean") return R"("true" | "false")";
    if (which == "null") return R"("null")";
    if (which == "value") return any_value_body(kAnyValueDepth);
    if (which.starts_with("value-")) return any_value_body(std::stoi(which.substr(6)));
    if (which == "year") return "[0-9]{4}";
    if (which == "leap-year") {
      return R"([0-9]{2} ("0" [48] | [2468] [048] | [13579] [26]) | ("0" [048] | [2468] [048] | [13579] [26]) "00")";
    }
    if (which == "date") {
      return prim("leap-year") + R"( "-02-29" | )" + prim("year") +
             R"( "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))";
    }
    if (which == "time") {
      return R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" ([0-5] [0-9] | "60") ("." [0-9]{1,9})? ([Zz] | ("+" | "-") ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
    }
    if (which == "date-time") return prim("date") + " [Tt] " + prim("time");
    if (which == "uuid") {
      return R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})";
    }
    throw std::logic_error("json_schema: no primitive " + which);
  }

  std::string any_value_name(int level) {
    return prim(level == kAnyValueDepth ? "value" : "value-" + std::to_string(level));
  }

  std::string any_object_body(int inner) {
    const std::string ws = prim("ws"), v = any_value_name(inner);
    const std::string member = seq({prim("string"), ws, R"(":")", ws, v, ws});
    return seq({R"("{")", ws, "(" + member + " (\",\" " + ws + " " + member + ")*)?", R"("}")"});
  }

  // Any JSON value with at most `level` arrays/objects nested in it.
  std::string any_value_body(int level) {
    std::vector<std::string> alts;
    if (level > 0) {
      const std::string ws = prim("ws"), v = any_value_name(level - 1);
      alts.push_back(any_object_body(level - 1));
      alts.push_back(
          seq({R"("[")", ws, "(" + v + " " + ws + " (\",\" " + ws + " " + v + " " + ws + ")*)?",
               R"("]")"}));
    }
    for (const char* p : {"string", "number", "boolean", "null"}) alts.push_back(prim(p));
    return join(alts, " | ");
  }

  // --- schemas ---

  // A GBNF expression (safe to place in a sequence) for the values valid against `s`.
  std::string visit(const Json& s, const std::string& ptr, int depth) {
    if (depth > kMaxSchemaDepth) fail(ptr, "schema nested deeper than 64");
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value_name(kAnyValueDepth);
      fail(ptr, "the false schema (no valid value) is not supported");
    }
    if (!s.is_object()) fail(ptr, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      if (kRefused.count(k) && !(k == "uniqueItems" && v == false)) {
        fail(ptr + "/" + escape_pointer_token(k), "'" + k + "' is not supported");
      }
    }
    // `only` is the keyword being handled; another constraint beside it would need an intersection.
    const auto alone = [&](std::string_view only) {
      for (const auto& [k, v] : s.items()) {
        if (k != only && kConstraints.count(k)) {
          fail(ptr + "/" + escape_pointer_token(k),
               "'" + k + "' beside '" + std::string(only) + "' is not supported");
        }
      }
    };
    if (s.contains("$ref")) {
      alone("$ref");
      return ref_rule(s["$ref"], ptr + "/$ref", depth);
    }
    if (s.contains("allOf")) {
      alone("allOf");
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1)
        fail(ptr + "/allOf", "only allOf with one schema is supported");
      return visit(all[0], ptr + "/allOf/0", depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      alone(key);
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) fail(ptr + "/" + key, "must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        alts.push_back(visit(list[i], ptr + "/" + key + "/" + std::to_string(i), depth + 1));
      }
      return group(alts);
    }
    if (s.contains("enum") || s.contains("const")) return enum_values(s, ptr);
    return typed(s, ptr, depth);
  }

  std::string ref_rule(const Json& ref, const std::string& ptr, int depth) {
    if (!ref.is_string()) fail(ptr, "must be a string");
    const std::string r = ref.get<std::string>();
    if (left_refs_.count(r)) {
      fail(ptr, "'" + r + "' refers back to itself before any '{' or '[' (left recursion)");
    }
    if (const auto it = ref_rules_.find(r); it != ref_rules_.end()) return it->second;
    if (!r.starts_with("#/")) fail(ptr, "'" + r + "': only local references (#/...) are supported");
    const Json* target = nullptr;
    try {
      target = &root_.at(Json::json_pointer(r.substr(1)));
    } catch (const std::exception&) {
      fail(ptr, "'" + r + "' does not resolve in this schema");
    }
    const std::string name = reserve(r.substr(r.rfind('/') + 1));
    ref_rules_[r] = name;
    left_refs_.insert(r);
    define(name, visit(*target, r.substr(1), depth + 1));
    left_refs_.erase(r);
    return name;
  }

  std::string enum_values(const Json& s, const std::string& ptr) {
    for (const auto& [k, v] : s.items()) {
      if (kConstraints.count(k) && k != "enum" && k != "const" && k != "type") {
        fail(ptr + "/" + escape_pointer_token(k), "'" + k + "' beside enum/const is not supported");
      }
    }
    std::vector<Json> values;
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(ptr + "/enum", "must be a non-empty array");
      values.assign(e.begin(), e.end());
    }
    if (s.contains("const")) {
      const Json& c = s["const"];
      if (s.contains("enum") && std::find(values.begin(), values.end(), c) == values.end()) {
        fail(ptr + "/const", "the const value is not in the enum");
      }
      values = {c};
    }
    std::vector<std::string> types;
    if (s.contains("type")) types = type_list(s["type"], ptr + "/type");
    std::vector<std::string> alts;
    for (const Json& v : values) {
      const bool ok =
          types.empty() || std::any_of(types.begin(), types.end(),
                                       [&](const std::string& t) { return has_type(v, t); });
      if (ok) alts.push_back(lit(v.dump()));
    }
    if (alts.empty()) fail(ptr, "no enum/const value has the schema's type");
    return group(alts);
  }

  std::vector<std::string> type_list(const Json& t, const std::string& ptr) {
    static const std::set<std::string, std::less<>> kTypes = {
        "string", "number", "integer", "boolean", "null", "object", "array"};
    std::vector<std::string> out;
    const auto add = [&](const Json& v, const std::string& p) {
      if (!v.is_string() || !kTypes.count(v.get_ref<const std::string&>())) {
        fail(p, "unknown type " + v.dump());
      }
      if (std::find(out.begin(), out.end(), v.get<std::string>()) == out.end()) {
        out.push_back(v.get<std::string>());
      }
    };
    if (t.is_array()) {
      if (t.empty()) fail(ptr, "an empty type list allows nothing");
      for (size_t i = 0; i < t.size(); ++i) add(t[i], ptr + "/" + std::to_string(i));
    } else {
      add(t, ptr);
    }
    // Every integer is a number: keep one spelling, so a digit string parses one way.
    if (std::find(out.begin(), out.end(), "number") != out.end()) {
      out.erase(std::remove(out.begin(), out.end(), "integer"), out.end());
    }
    return out;
  }

  std::string typed(const Json& s, const std::string& ptr, int depth) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      types = type_list(s["type"], ptr + "/type");
    } else {
      const bool constrained = std::any_of(s.items().begin(), s.items().end(), [](const auto& kv) {
        return kTypeKeywords.count(kv.key());
      });
      if (!constrained) return any_value_name(kAnyValueDepth);
      // No type: every type, each under the keywords that apply to it.
      types = {"object", "array", "string", "number", "boolean", "null"};
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      if (t == "string") alts.push_back(string_type(s, ptr));
      if (t == "number") alts.push_back(number_type(s, ptr));
      if (t == "integer") alts.push_back(integer_type(s, ptr));
      if (t == "boolean") alts.push_back(prim("boolean"));
      if (t == "null") alts.push_back(prim("null"));
      if (t == "object") alts.push_back(object_type(s, ptr, depth));
      if (t == "array") alts.push_back(array_type(s, ptr, depth));
    }
    return alts.size() == 1 ? alts[0] : group(alts);
  }

  // A non-negative integer keyword, bounded like every repetition.
  std::optional<int64_t> count(const Json& s, const char* key, const std::string& ptr) {
    if (!s.contains(key)) return std::nullopt;
    const Json& v = s[key];
    if (!has_type(v, "integer") || v.get<double>() < 0)
      fail(ptr + "/" + key, "must be a non-negative integer");
    if (v.get<double>() > kMaxRepeat) fail(ptr + "/" + key, "more than 10000 is not supported");
    return v.get<int64_t>();
  }

  std::string string_type(const Json& s, const std::string& ptr) {
    const auto min = count(s, "minLength", ptr), max = count(s, "maxLength", ptr);
    if (s.contains("format")) {
      const Json& f = s["format"];
      static const std::set<std::string, std::less<>> kFormats = {"date", "time", "date-time",
                                                                  "uuid"};
      if (!f.is_string() || !kFormats.count(f.get_ref<const std::string&>())) {
        fail(ptr + "/format",
             "format " + f.dump() + " is not supported (date, time, date-time, uuid are)");
      }
      if (min || max) fail(ptr + "/format", "format beside minLength/maxLength is not supported");
      return seq({R"("\"")", prim(f.get<std::string>()), R"("\"")"});
    }
    if (!min && !max) return prim("string");
    if (max && *max < min.value_or(0)) fail(ptr + "/maxLength", "is less than minLength");
    return seq({R"("\"")", repeated(prim("char"), min.value_or(0), max.value_or(-1)), R"("\"")"});
  }

  std::string number_type(const Json& s, const std::string& ptr) {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(k))
        fail(ptr + "/" + k, std::string(k) + " on type number is not supported (on integer it is)");
    }
    return prim("number");
  }

  std::string integer_type(const Json& s, const std::string& ptr) {
    const auto num = [&](const char* k) -> std::optional<double> {
      if (!s.contains(k)) return std::nullopt;
      const Json& v = s[k];
      if (v.is_boolean()) return std::nullopt;  // draft 4's exclusive flags, read below
      if (!v.is_number()) fail(ptr + "/" + k, "must be a number");
      return v.get<double>();
    };
    const auto flag = [&](const char* k) { return s.contains(k) && s[k] == true; };
    const auto mn = num("minimum"), mx = num("maximum"), xmn = num("exclusiveMinimum"),
               xmx = num("exclusiveMaximum");
    if (!mn && !mx && !xmn && !xmx) return prim("integer");
    double lo = -static_cast<double>(kIntLimit), hi = static_cast<double>(kIntLimit);
    if (mn) lo = std::max(lo, flag("exclusiveMinimum") ? std::floor(*mn) + 1 : std::ceil(*mn));
    if (xmn) lo = std::max(lo, std::floor(*xmn) + 1);
    if (mx) hi = std::min(hi, flag("exclusiveMaximum") ? std::ceil(*mx) - 1 : std::floor(*mx));
    if (xmx) hi = std::min(hi, std::ceil(*xmx) - 1);
    if (lo > hi) fail(ptr, "no integer of at most 16 digits lies between the bounds");
    return integer_range(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  }

  std::string object_type(const Json& s, const std::string& ptr, int depth);
  std::string additional_key(const std::vector<std::string>& listed, std::string_view hint);
  std::string array_type(const Json& s, const std::string& ptr, int depth);

  const Json& root_;
  std::string prefix_;
  std::vector<std::pair<std::string, std::string>> rules_;  // name, body; in order of reservation
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> ref_rules_;  // "$ref" text -> its rule
  std::set<std::string> left_refs_;               // refs entered since the last '{' or '['
  int counter_ = 0;
};

// Listed properties in the schema's order (each may be left out unless required), then the
// additional ones. Two chains of rules: f<i> (nothing written yet: no comma before the next) and
// t<i> (something written: a comma before each), so optional properties cost 2 rules each, not a
// combination each.
std::string Converter::object_type(const Json& s, const std::string& ptr, int depth) {
  const auto saved_left = std::exchange(left_refs_, {});  // '{' is consumed before any member
  const std::string ws = prim("ws");
  struct Prop {
    std::string key;
    std::string kv;
    bool required;
  };
  std::vector<Prop> props;
  std::set<std::string> required;
  if (s.contains("required")) {
    const Json& r = s["required"];
    if (!r.is_array()) fail(ptr + "/required", "must be an array of names");
    for (const Json& n : r) {
      if (!n.is_string()) fail(ptr + "/required", "must be an array of names");
      required.insert(n.get<std::string>());
    }
  }
  const auto kv = [&](const std::string& key, const std::string& value) {
    return seq({lit(Json(key).dump()), ws, R"(":")", ws, value});
  };
  if (s.contains("properties")) {
    const Json& p = s["properties"];
    if (!p.is_object()) fail(ptr + "/properties", "must be an object");
    for (const auto& [key, sub] : p.items()) {
      const std::string v = visit(sub, ptr + "/properties/" + escape_pointer_token(key), depth + 1);
      props.push_back({key, kv(key, v), required.count(key) > 0});
    }
  }
  // additionalProperties: absent/true = any value, false = none, a schema = its values.
  std::optional<std::string> extra_value = any_value_name(kAnyValueDepth);
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (a == false) {
      extra_value.reset();
    } else {
      extra_value = visit(a, ptr + "/additionalProperties", depth + 1);
    }
  }
  for (const std::string& name : required) {  // required but not listed: last, as an extra
    const bool listed =
        std::any_of(props.begin(), props.end(), [&](const Prop& p) { return p.key == name; });
    if (listed) continue;
    if (!extra_value)
      fail(ptr + "/required", "'" + name + "' is required but additionalProperties is false");
    props.push_back({name, kv(name, *extra_value), true});
  }
  std::optional<std::string> extra;  // one additional member
  if (extra_value) {
    std::vector<std::string> names;
    for (const Prop& p : props) names.push_back(p.key);
    extra = seq({additional_key(names, "key"), ws, R"(":")", ws, *extra_value});
    extra = as_rule("extra", *extra);
  }
  const std::string comma = seq({R"(",")", ws});
  std::string t_next = extra ? "(" + seq({comma, *extra, ws}) + ")*" : "";
  std::string f_next = extra ? "(" + seq({*extra, ws, t_next}) + ")?" : "";
  for (size_t i = props.size(); i-- > 0;) {
    const Prop& p = props[i];
    const std::string member = seq({p.kv, ws});
    std::string t = p.required ? seq({comma, member, t_next})
                               : seq({"(" + seq({comma, member}) + ")?", t_next});
    std::string f;
    if (p.required) {
      f = seq({member, t_next});
    } else if (f_next.empty()) {
      f = "(" + seq({member, t_next}) + ")?";
    } else {
      f = "(" + seq({member, t_next}) + " | " + f_next + ")";
    }
    if (i > 0) t_next = as_rule("t", t);  // the first property's t is never used
    f_next = as_rule("f", f);
  }
  left_refs_ = saved_left;
  return seq({R"("{")", ws, f_next, R"("}")"});
}

// The quoted key of an additional property: any key but the listed names. A trie of the names'
// JSON spellings, one rule per node: the next character continues a name, or leaves every name
// (then anything may follow), or the key ends where no name ends.
std::string Converter::additional_key(const std::vector<std::string>& listed,
                                      std::string_view hint) {
  struct Node {
    std::map<std::string, size_t> kids;  // next unit (a character or a 2-byte escape) -> node
    bool end = false;
  };
  std::vector<Node> nodes(1);
  for (const std::string& name : listed) {
    const std::string text = Json(name).dump();
    const std::string_view body = std::string_view(text).substr(1, text.size() - 2);
    if (body.find("\\u") != std::string_view::npos) continue;  // no key-char spells it
    size_t at = 0;
    for (size_t i = 0; i < body.size();) {
      size_t len = 1;
      const auto c = static_cast<unsigned char>(body[i]);
      if (c == '\\')
        len = 2;
      else if (c >= 0xF0)
        len = 4;
      else if (c >= 0xE0)
        len = 3;
      else if (c >= 0xC0)
        len = 2;
      const std::string unit(body.substr(i, len));
      i += len;
      auto it = nodes[at].kids.find(unit);
      if (it == nodes[at].kids.end()) {
        nodes.push_back({});
        it = nodes[at].kids.emplace(unit, nodes.size() - 1).first;
      }
      at = it->second;
    }
    nodes[at].end = true;
  }
  if (nodes.size() == 1 && !nodes[0].end) return prim("string");
  const std::string kc = prim("key-char");
  std::vector<std::string> names(nodes.size());
  for (auto& n : names) n = reserve(hint);
  for (size_t id = 0; id < nodes.size(); ++id) {
    std::vector<std::string> alts;
    std::string raw_excluded, esc_letters = "\"\\bfnrt";
    for (const auto& [unit, kid] : nodes[id].kids) {
      alts.push_back(seq({lit(unit), names[kid]}));
      if (unit[0] == '\\') {
        esc_letters.erase(esc_letters.find(unit[1]), 1);
      } else {
        raw_excluded += class_char(unit);
      }
    }
    alts.push_back("[^\\x22\\x5C\\x00-\\x1F" + raw_excluded + "] " + kc + "*");
    if (!esc_letters.empty()) {
      std::string cls;
      for (const char c : esc_letters) cls += class_char(std::string(1, c));
      alts.push_back(R"("\\" [)" + cls + "] " + kc + "*");
    }
    define(names[id], nodes[id].end ? join(alts, " | ") : "(" + join(alts, " | ") + ")?");
  }
  return seq({R"("\"")", names[0], R"("\"")"});
}

// prefixItems (or draft-4's items array) for the first positions, then `items` (or
// additionalItems) for the rest, minItems/maxItems over all of them. Positions with their own
// schema chain through rules e<i>; the uniform tail is one bounded repetition.
std::string Converter::array_type(const Json& s, const std::string& ptr, int depth) {
  const auto saved_left = std::exchange(left_refs_, {});  // '[' is consumed before any item
  const std::string ws = prim("ws");
  const Json* prefix = nullptr;
  std::string prefix_key = "prefixItems", tail_key = "items";
  if (s.contains("prefixItems")) {
    prefix = &s["prefixItems"];
  } else if (s.contains("items") && s["items"].is_array()) {
    prefix = &s["items"];
    prefix_key = "items";
    tail_key = "additionalItems";
  }
  if (prefix && !prefix->is_array()) fail(ptr + "/" + prefix_key, "must be an array of schemas");
  const int64_t k = prefix ? static_cast<int64_t>(prefix->size()) : 0;
  if (k > kMaxRepeat) fail(ptr + "/" + prefix_key, "more than 10000 positions are not supported");
  const int64_t min = count(s, "minItems", ptr).value_or(0);
  const std::optional<int64_t> max = count(s, "maxItems", ptr);
  if (max && *max < min) fail(ptr + "/maxItems", "is less than minItems");
  // The schema of the items after the prefix: none when it is false.
  std::optional<std::string> tail;
  if (!s.contains(tail_key) || s[tail_key] != false) {
    tail = s.contains(tail_key) ? visit(s[tail_key], ptr + "/" + tail_key, depth + 1)
                                : any_value_name(kAnyValueDepth);
    tail = as_rule("item", *tail);
  }
  if (!tail && min > k) fail(ptr + "/minItems", "asks for more items than the schema allows");
  const int64_t last = max ? std::min(k, *max) : k;  // positions with their own schema
  const std::string comma = seq({R"(",")", ws});
  std::string next;  // what follows position i
  if (tail && (!max || *max > k)) {
    const int64_t rmin = std::max<int64_t>(min - k, 0), rmax = max ? *max - k : -1;
    if (k > 0) {
      next = repeated("(" + seq({comma, *tail, ws}) + ")", rmin, rmax);
    } else {
      const int64_t more_max = rmax < 0 ? -1 : rmax - 1;
      std::string body = seq({*tail, ws});
      if (more_max != 0) {
        body = seq({body, repeated("(" + seq({comma, *tail, ws}) + ")",
                                   std::max<int64_t>(rmin - 1, 0), more_max)});
      }
      next = rmin == 0 ? "(" + body + ")?" : body;
    }
  }
  for (int64_t i = last; i-- > 0;) {
    const std::string item =
        visit((*prefix)[i], ptr + "/" + prefix_key + "/" + std::to_string(i), depth + 1);
    std::string e = seq({i > 0 ? comma : "", item, ws, next});
    if (i >= min) e = "(" + e + ")?";
    next = as_rule("e", e);
  }
  left_refs_ = saved_left;
  return seq({R"("[")", ws, next, R"("]")"});
}

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                const SchemaGrammarOptions& opt) {
  return Converter(schema, opt.prefix).schema_root();
}

std::string json_object_gbnf(const SchemaGrammarOptions& opt) {
  static const Json kEmpty = Json::object();
  return Converter(kEmpty, opt.prefix).object_root();
}

}  // namespace moe::grammar
