#include "coordinator/chat_template/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_limits.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  for (auto& [k, old] : entries) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(v));
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.p_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  return p_ ? *static_cast<const std::string*>(p_.get()) : kEmpty;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double f) : kind_(Kind::Float), f_(f) {}
Value::Value(std::string s)
    : kind_(Kind::String), p_(std::make_shared<const std::string>(std::move(s))) {}
namespace {
constexpr uint16_t kMaxNesting = 150;
}  // namespace

Value::Value(List l, bool tuple) : kind_(Kind::List), tuple_(tuple) {
  for (const Value& v : l) depth_ = std::max<uint16_t>(depth_, depth_of(v));
  if (++depth_ > kMaxNesting) fail("value nested too deeply");
  p_ = std::make_shared<const List>(std::move(l));
}

Value::Value(Dict d) : kind_(Kind::Dict) {
  for (const auto& e : d.entries) depth_ = std::max<uint16_t>(depth_, depth_of(e.second));
  if (++depth_ > kMaxNesting) fail("value nested too deeply");
  p_ = std::make_shared<const Dict>(std::move(d));
}
Value::Value(Function f)
    : kind_(Kind::Function), p_(std::make_shared<const Function>(std::move(f))) {}

Value Value::make_namespace(Dict attrs) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.p_ = std::make_shared<Namespace>(Namespace{std::move(attrs)});
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::Float:
      return f_;
    case Kind::Int:
      return static_cast<double>(i_);
    case Kind::Bool:
      return b_ ? 1.0 : 0.0;
    default:
      fail("expected a number, got " + type_name());
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return f_ != 0.0;
    case Kind::String:
      return !as_string().empty();
    case Kind::List:
      return !as_list().empty();
    case Kind::Dict:
      return !as_dict().entries.empty();
    case Kind::Function:
    case Kind::Namespace:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return tuple_ ? "tuple" : "list";
    case Kind::Dict:
      return "dict";
    case Kind::Function:
      return "function";
    case Kind::Namespace:
      return "Namespace";
  }
  return "object";
}

const Value* CallArgs::find_kwarg(std::string_view name) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

Value CallArgs::get(size_t index, std::string_view name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  if (const Value* v = find_kwarg(name)) return *v;
  return fallback;
}

bool equals(const Value& a, const Value& b) {
  ValueDepthGuard guard;
  charge_step();
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.as_string() == b.as_string();
    case Value::Kind::List: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::Function:
      return &a.as_function() == &b.as_function();
    case Value::Kind::Namespace:
      return &a.as_namespace() == &b.as_namespace();
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  ValueDepthGuard guard;
  charge_step();
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      const int64_t x = a.as_int(), y = b.as_int();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // Byte order of UTF-8 equals code point order.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() +
       "'");
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string out = sign;
  if (exp >= -5 + 1 && exp < 16) {
    const int point = exp + 1;  // digits before the decimal point
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." +
             digits.substr(static_cast<size_t>(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string to_repr(const Value& v) {
  if (v.is_string()) return repr_string(v.as_string());
  return to_str(v);
}

std::string to_str(const Value& v) {
  ValueDepthGuard guard;
  charge_step();
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(v.as_int());
    case Value::Kind::Float:
      return format_float(v.as_double());
    case Value::Kind::String:
      return v.as_string();
    case Value::Kind::List: {
      std::string out = v.is_tuple() ? "(" : "[";
      const List& l = v.as_list();
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += ", ";
        out += to_repr(l[i]);
        check_size(out.size());
      }
      if (v.is_tuple() && l.size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      const Dict& d = v.is_dict() ? v.as_dict() : v.as_namespace().attrs;
      std::string out = v.is_dict() ? "{" : "<Namespace {";
      bool first = true;
      for (const auto& [k, x] : d.entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(x);
        check_size(out.size());
      }
      return out + (v.is_dict() ? "}" : "}>");
    }
    case Value::Kind::Function:
      return "<function " + v.as_function().name + ">";
  }
  return "";
}

}  // namespace moe::jinja
