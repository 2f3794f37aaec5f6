// jinja2's builtin behaviour on values: operators, attribute and item lookup (with the
// str/dict methods the sandbox allows), iteration, filters and tests. Everything here is pure
// value manipulation; the interpreter (scopes, macros, output) lives in jinja_interpreter.
// Errors are thrown as jinja::Error without a position (the interpreter adds it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "coordinator/chat_template/jinja_value.h"

namespace moe::jinja {

// --- operators and lookup (jinja_operators.cpp) ------------------------------------------------
[[noreturn]] void fail_undefined(const Value& undefined);
// Arithmetic and string operators: + - * / // % ** (Python semantics, overflow is an error).
Value binary_op(std::string_view op, const Value& a, const Value& b);
// `item in container`.
bool contains(const Value& container, const Value& item);
// `obj.name`: dict key or method, string method, namespace attribute; Undefined when missing.
Value get_attr(const Value& obj, const std::string& name);
// `obj[key]`: list/string index (negative counts from the end), dict key; Undefined when missing.
Value get_item(const Value& obj, const Value& key);
// `obj[start:stop:step]` on lists and strings; absent parts are Undefined or None.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// What a for loop visits: list items, dict keys, string characters; nothing for Undefined.
List iterate(const Value& v);
// Python's `fmt % args` (%s %r %d %i %f %x %% with flags, width and precision).
std::string percent_format(const std::string& fmt, const Value& args);

// --- methods (jinja_methods.cpp) ----------------------------------------------------------------
// Python str.replace (count < 0: all). An empty `old` inserts `repl` between code points.
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count);
// A bound str or dict method, or Undefined when `name` is not one we provide.
Value string_method(const Value& self, const std::string& name);
Value dict_method(const Value& self, const std::string& name);

// --- filters and tests (jinja_filters.cpp, jinja_tests.cpp) --------------------------------------
using FilterFn = Value (*)(const Value& input, const CallArgs& args);
using TestFn = bool (*)(const Value& input, const CallArgs& args);
FilterFn find_filter(std::string_view name);  // nullptr when unknown
TestFn find_test(std::string_view name);      // nullptr when unknown

}  // namespace moe::jinja
