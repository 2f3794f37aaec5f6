// Syntax tree of a parsed template. Nodes are plain structs with a kind tag; each kind documents
// which fields it uses. Every node keeps its source byte offset for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/chat_template/jinja_value.h"

namespace moe::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    List,       // items
    Tuple,      // items
    Dict,       // items = key0, value0, key1, value1, ...
    Attr,       // target . name
    Subscript,  // target [ items[0] ]
    Slice,      // items[0..2] = start, stop, step (null when absent); only inside Subscript
    Call,       // target ( items, kwargs )
    Filter,     // name; items[0] = input, then the filter's positional args; kwargs
    Test,       // name; items[0] = input, then args; negated
    Unary,      // op ("-", "+", "not"); items[0]
    Binary,     // op; items[0], items[1] (arithmetic, "~", "and", "or")
    Compare,    // items[0] op[0] items[1] op[1] items[2] ... (ops in compare_ops)
    CondExpr,   // items[0] if items[1] else items[2] (items[2] may be null)
  };
  Kind kind;
  size_t pos;
  Value value;
  std::string name;  // name, attribute, filter, test or operator
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> compare_ops;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// A macro parameter with its optional default value.
struct Param {
  std::string name;
  ExprPtr default_value;
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // expr
    If,           // branches (cond, body); else_body
    For,          // targets, expr (iterable), cond (optional filter), body, else_body
    Set,          // targets (or ns_name + attr), expr
    SetBlock,     // targets[0]; body; filters (applied to the captured text)
    Macro,        // name; params; body
    CallBlock,    // expr (the call); params (caller's); body (caller's)
    FilterBlock,  // filters; body
    With,         // targets + with_values; body
    Break,
    Continue,
  };
  Kind kind;
  size_t pos;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string ns_name, attr;  // {% set ns_name.attr = ... %}
  std::string name;
  std::vector<Param> params;
  std::vector<ExprPtr> filters;  // Filter nodes whose items[0] is null (the input is supplied)
  std::vector<ExprPtr> with_values;
};

}  // namespace moe::jinja
