#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "coordinator/chat_template/jinja_builtins.h"
#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_limits.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {

void fail_undefined(const Value& undefined) {
  const std::string& hint = undefined.undefined_hint();
  fail(hint.empty() ? "value is undefined" : hint);
}

namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() + "' and '" +
       b.type_name() + "'");
}

Value repeat(const Value& seq, const Value& count) {
  const int64_t n = std::max<int64_t>(0, count.as_int());
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(n) > (std::numeric_limits<size_t>::max() / s.size()))
      fail("template produced a string larger than the limit");
    charge_string(s.size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const List& l = seq.as_list();
  if (!l.empty() && static_cast<uint64_t>(n) > (std::numeric_limits<size_t>::max() / l.size()))
    fail("template produced a list longer than the limit");
  if (Budget* b = ActiveBudget::get()) b->list_items(l.size() * static_cast<size_t>(n));
  List out;
  out.reserve(l.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.begin(), l.end());
  return Value(std::move(out), seq.is_tuple());
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  if (ints) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    bool overflow = false;
    if (op == "+" || op == "-" || op == "*") {
      overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                 : op == "-" ? __builtin_sub_overflow(x, y, &r)
                             : __builtin_mul_overflow(x, y, &r);
      if (overflow) fail("integer overflow");
      return Value(r);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) fail("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward negative infinity
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (op == "**" && y >= 0) {
      int64_t acc = 1, base = x, e = y;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(acc, base, &acc)) fail("integer overflow");
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
      }
      return Value(acc);
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "/") {
    if (y == 0) fail("division by zero");
    return Value(x / y);
  }
  if (op == "//") {
    if (y == 0) fail("float floor division by zero");
    return Value(std::floor(x / y));
  }
  if (op == "%") {
    if (y == 0) fail("float modulo");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  if (op == "**") {
    if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(x, y));
  }
  unsupported(op, a, b);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      charge_string(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      const List &x = a.as_list(), &y = b.as_list();
      if (Budget* bud = ActiveBudget::get()) bud->list_items(x.size() + y.size());
      List out = x;
      out.insert(out.end(), y.begin(), y.end());
      return Value(std::move(out), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a);
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  unsupported(op, a, b);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;  // iterating Undefined yields nothing
    case Value::Kind::String:
      if (!item.is_string()) {
        fail("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& v : container.as_list())
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::Dict:
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      fail("argument of type '" + container.type_name() + "' is not iterable");
  }
}

namespace {

// jinja2 describes the object in "has no attribute" messages like this.
std::string object_repr(const Value& v) {
  if (v.is_none()) return "'None'";
  std::string s = "'";  // built by appends: GCC 12 warns falsely (-Wrestrict) on "x" + str
  s += v.type_name();
  s += " object'";
  return s;
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined(object_repr(obj) + " has no attribute '" + name + "'");
}

// Python index normalisation; returns false when out of range.
bool normalize_index(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && static_cast<uint64_t>(i) < size;
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(obj);
    case Value::Kind::Dict: {
      // Python getattr first: dict methods shadow keys of the same name (jinja2 does this too).
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return missing_attr(obj, name);
    }
    case Value::Kind::Namespace:
      if (const Value* v = obj.as_namespace().attrs.find(name)) return *v;
      return missing_attr(obj, name);
    case Value::Kind::String: {
      Value m = string_method(obj, name);
      if (!m.is_undefined()) return m;
      return missing_attr(obj, name);
    }
    default:
      return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(obj);
    case Value::Kind::List:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.as_int();
        const List& l = obj.as_list();
        if (normalize_index(i, l.size())) return l[static_cast<size_t>(i)];
        return Value::undefined(obj.type_name() + " object has no element " + to_str(key));
      }
      break;
    case Value::Kind::String:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.as_int();
        const std::string& s = obj.as_string();
        if (is_ascii(s)) {
          if (normalize_index(i, s.size())) return Value(std::string(1, s[static_cast<size_t>(i)]));
        } else {
          const std::u32string cs = utf8_decode(s);
          if (normalize_index(i, cs.size())) {
            return Value(utf8_encode(std::u32string(1, cs[static_cast<size_t>(i)])));
          }
        }
        return Value::undefined("str object has no element " + to_str(key));
      }
      break;
    case Value::Kind::Dict:
      if (key.is_string()) {
        if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
      }
      break;
    default:
      break;
  }
  // jinja2 falls back to getattr for string keys (so d['items'] finds the method).
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(object_repr(obj) + " has no element " + to_repr(key));
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto opt_int = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail(std::string("slice ") + what + " must be an integer");
    return v.as_int();
  };
  const int64_t step = opt_int(step_v, "step").value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::u32string chars;
  size_t n;
  if (obj.is_string()) {
    chars = utf8_decode(obj.as_string());
    n = chars.size();
  } else if (obj.is_list()) {
    n = obj.as_list().size();
  } else {
    fail("'" + obj.type_name() + "' object is not subscriptable");
  }
  const auto len = static_cast<int64_t>(n);
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) {
      i += len;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
    return i;
  };
  const int64_t start = adjust(opt_int(start_v, "start"), step < 0 ? len - 1 : 0);
  const int64_t stop = adjust(opt_int(stop_v, "stop"), step < 0 ? -1 : len);
  std::vector<size_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    idx.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : idx) out += chars[i];
    return Value(utf8_encode(out));
  }
  List out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(obj.as_list()[i]);
  return Value(std::move(out), obj.is_tuple());
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
      return v.as_list();
    case Value::Kind::Dict: {
      List keys;
      keys.reserve(v.as_dict().entries.size());
      for (const auto& e : v.as_dict().entries) keys.emplace_back(e.first);
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (char32_t c : utf8_decode(v.as_string()))
        chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default:
      fail("'" + v.type_name() + "' object is not iterable");
  }
}

std::string percent_format(const std::string& fmt, const Value& args) {
  List positional = args.is_tuple() ? args.as_list() : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    // %[flags][width][.precision]conversion
    size_t j = i + 1;
    std::string spec = "%";
    bool left = false;
    while (j < fmt.size() && std::string_view("-+ #0").find(fmt[j]) != std::string_view::npos) {
      left = left || fmt[j] == '-';
      spec += fmt[j++];
    }
    size_t width = 0;
    while (j < fmt.size() && fmt[j] >= '0' && fmt[j] <= '9' && width < 1000) {
      width = width * 10 + static_cast<size_t>(fmt[j] - '0');
      spec += fmt[j++];
    }
    if (j < fmt.size() && fmt[j] == '.') {
      spec += fmt[j++];
      size_t digits = 0;
      while (j < fmt.size() && fmt[j] >= '0' && fmt[j] <= '9' && ++digits < 4) spec += fmt[j++];
    }
    if (j >= fmt.size()) fail("incomplete format");
    const char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= positional.size()) fail("not enough arguments for format string");
    const Value& arg = positional[next++];
    char buf[2048];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string s = conv == 's' ? to_str(arg) : to_repr(arg);
        const size_t len = utf8_length(s);
        const std::string pad = len < width ? std::string(width - len, ' ') : "";
        out += left ? s + pad : pad + s;
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!arg.is_number())
          fail(std::string("%") + conv + " format: a number is required, not " + arg.type_name());
        const long long v = arg.is_float() ? static_cast<long long>(arg.as_double()) : arg.as_int();
        std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), v);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!arg.is_number()) fail("must be real number, not " + arg.type_name());
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg.as_double());
        out += buf;
        break;
      default:
        fail(std::string("unsupported format character '") + conv + "'");
    }
    check_size(out.size());
  }
  if (next < positional.size() && args.is_tuple())
    fail("not all arguments converted during string formatting");
  charge_string(out.size());
  return out;
}

}  // namespace moe::jinja
