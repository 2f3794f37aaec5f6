// Dynamic values of the Jinja interpreter. They mirror the Python objects jinja2 works with
// (None, bool, int, float, str, list/tuple, dict, callables, namespace) plus jinja2's Undefined,
// so that truthiness, equality, printing and JSON output match what HF's renderer produces.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moe::jinja {

class Value;
struct CallArgs;

using List = std::vector<Value>;

// A dict keeps insertion order (Python 3.7+ dicts, and tojson output must preserve key order).
// Keys are strings: JSON objects only have string keys, and templates use string literals.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  // Inserts or replaces, keeping the original position of an existing key.
  void set(std::string key, Value v);
};

// A builtin function, bound method or macro. The function owns whatever it needs; values never
// outlive a render, so capturing the interpreter by reference is fine.
struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// jinja2's Namespace: the only mutable object (`{% set ns.attr = ... %}`); shared by reference.
struct Namespace {
  Dict attrs;
};

class Value {
 public:
  enum class Kind : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Dict,
    Function,
    Namespace
  };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b);                                   // NOLINT(google-explicit-constructor)
  Value(int64_t i);                                // NOLINT(google-explicit-constructor)
  Value(int i) : Value(int64_t{i}) {}              // NOLINT(google-explicit-constructor)
  Value(double f);                                 // NOLINT(google-explicit-constructor)
  Value(std::string s);                            // NOLINT(google-explicit-constructor)
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  Value(List l, bool tuple = false);               // NOLINT(google-explicit-constructor)
  Value(Dict d);                                   // NOLINT(google-explicit-constructor)
  Value(Function f);                               // NOLINT(google-explicit-constructor)
  static Value make_namespace(Dict attrs);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  // Python's bool is an int subclass: arithmetic and comparisons treat True as 1.
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_function() const { return kind_ == Kind::Function; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? int64_t{b_} : i_; }  // Int or Bool
  double as_double() const;                                                  // any number
  const std::string& as_string() const { return *static_cast<const std::string*>(p_.get()); }
  const List& as_list() const { return *static_cast<const List*>(p_.get()); }
  const Dict& as_dict() const { return *static_cast<const Dict*>(p_.get()); }
  const Function& as_function() const { return *static_cast<const Function*>(p_.get()); }
  // Namespaces are created mutable (make_namespace); only the stored pointer is const.
  Namespace& as_namespace() const {
    return *const_cast<Namespace*>(static_cast<const Namespace*>(p_.get()));
  }
  // For Undefined: the message to report when it is used (empty when unknown).
  const std::string& undefined_hint() const;

  bool truthy() const;
  // Python type name, for error messages ("str", "list", "NoneType" ...).
  std::string type_name() const;

 private:
  // Nesting depth of lists/dicts, limited at construction: destroying or walking a value nested a
  // million levels deep would overflow the stack.
  static uint16_t depth_of(const Value& v) { return v.depth_; }
  Kind kind_ = Kind::Undefined;
  bool tuple_ = false;
  uint16_t depth_ = 0;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  // The payload of strings, lists, dicts, functions, namespaces and Undefined hints, shared:
  // copying a Value is cheap, and a hostile template cannot multiply memory by copying.
  std::shared_ptr<const void> p_;
};

// Positional and keyword arguments of a call (filters get the filtered value separately).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> kwargs;

  // The argument at `index` or named `name`; `fallback` when neither was passed.
  Value get(size_t index, std::string_view name, Value fallback = Value()) const;
  const Value* find_kwarg(std::string_view name) const;
};

// Python equality (1 == 1.0 == True, element-wise for containers, Undefined equals Undefined).
bool equals(const Value& a, const Value& b);
// Python ordering for numbers, strings and lists; throws jinja::Error for other types.
int compare(const Value& a, const Value& b);

// Python str() and repr() of a value: what `{{ x }}` prints and `|string` returns.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// Python repr() of a float: shortest round-trip digits, "1.0", "1e+16", "inf".
std::string format_float(double d);

}  // namespace moe::jinja
