// jinja2's builtin tests (`x is defined`, `x is string` ...), with Python's type rules: bool
// counts as a number, strings/lists/dicts are iterable and sequences, Undefined is iterable.
#include <cmath>

#include "coordinator/chat_template/jinja_builtins.h"
#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {
namespace {

Value arg0(const CallArgs& a) {
  if (a.positional.empty() && a.kwargs.empty()) fail("test is missing its argument");
  return a.positional.empty() ? a.kwargs.front().second : a.positional.front();
}

bool t_defined(const Value& v, const CallArgs&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, const CallArgs&) { return v.is_undefined(); }
bool t_none(const Value& v, const CallArgs&) { return v.is_none(); }
bool t_boolean(const Value& v, const CallArgs&) { return v.is_bool(); }
bool t_true(const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_string(const Value& v, const CallArgs&) { return v.is_string(); }
bool t_number(const Value& v, const CallArgs&) { return v.is_number(); }
bool t_integer(const Value& v, const CallArgs&) { return v.is_int(); }
bool t_float(const Value& v, const CallArgs&) { return v.is_float(); }
bool t_mapping(const Value& v, const CallArgs&) { return v.is_dict(); }
bool t_callable(const Value& v, const CallArgs&) { return v.is_function(); }
bool t_iterable(const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_escaped(const Value&, const CallArgs&) { return false; }
bool t_lower(const Value& v, const CallArgs&) {
  if (!v.is_string()) return false;
  const std::string& s = v.as_string();
  return ascii_lower(s) == s && ascii_upper(s) != s;
}
bool t_upper(const Value& v, const CallArgs&) {
  if (!v.is_string()) return false;
  const std::string& s = v.as_string();
  return ascii_upper(s) == s && ascii_lower(s) != s;
}
bool t_odd(const Value& v, const CallArgs&) {
  if (!v.is_int() && !v.is_bool()) fail("odd test requires an integer");
  return v.as_int() % 2 != 0;
}
bool t_even(const Value& v, const CallArgs&) {
  if (!v.is_int() && !v.is_bool()) fail("even test requires an integer");
  return v.as_int() % 2 == 0;
}
bool t_divisibleby(const Value& v, const CallArgs& a) {
  const Value n = arg0(a);
  if (v.is_float() || n.is_float()) {
    if (n.as_double() == 0) fail("float modulo");
    return std::fmod(v.as_double(), n.as_double()) == 0;
  }
  if (n.as_int() == 0) fail("integer division or modulo by zero");
  if (n.as_int() == -1) return true;
  return v.as_int() % n.as_int() == 0;
}
bool t_eq(const Value& v, const CallArgs& a) { return equals(v, arg0(a)); }
bool t_ne(const Value& v, const CallArgs& a) { return !equals(v, arg0(a)); }
bool t_lt(const Value& v, const CallArgs& a) { return compare(v, arg0(a)) < 0; }
bool t_le(const Value& v, const CallArgs& a) { return compare(v, arg0(a)) <= 0; }
bool t_gt(const Value& v, const CallArgs& a) { return compare(v, arg0(a)) > 0; }
bool t_ge(const Value& v, const CallArgs& a) { return compare(v, arg0(a)) >= 0; }
bool t_in(const Value& v, const CallArgs& a) { return contains(arg0(a), v); }
// Identity is approximated by same type and equal value (exact for None, True and False).
bool t_sameas(const Value& v, const CallArgs& a) {
  const Value o = arg0(a);
  return v.kind() == o.kind() && equals(v, o);
}
bool t_filter(const Value& v, const CallArgs&) {
  return v.is_string() && find_filter(v.as_string());
}
bool t_test(const Value& v, const CallArgs&) { return v.is_string() && find_test(v.as_string()); }

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"filter", t_filter},
    {"float", t_float},
    {"ge", t_ge},
    {">=", t_ge},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"<=", t_le},
    {"lower", t_lower},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"!=", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"test", t_test},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

}  // namespace

TestFn find_test(std::string_view name) {
  for (const TestEntry& t : kTests)
    if (t.name == name) return t.fn;
  return nullptr;
}

}  // namespace moe::jinja
