#include "coordinator/chat_template/jinja_interpreter.h"

#include <memory>

#include "coordinator/chat_template/jinja_builtins.h"
#include "coordinator/chat_template/jinja_error.h"

namespace moe::jinja {

namespace {

void validate_expr(const Expr* e) {
  if (!e) return;
  if (e->kind == Expr::Kind::Filter && !find_filter(e->name))
    fail("no filter named '" + e->name + "'", e->pos);
  if (e->kind == Expr::Kind::Test && !find_test(e->name))
    fail("no test named '" + e->name + "'", e->pos);
  for (const auto& c : e->items) validate_expr(c.get());
  for (const auto& kw : e->kwargs) validate_expr(kw.second.get());
}

void validate_body(const Body& body) {
  for (const auto& s : body) {
    validate_expr(s->expr.get());
    validate_expr(s->cond.get());
    for (const auto& [c, b] : s->branches) {
      validate_expr(c.get());
      validate_body(b);
    }
    validate_body(s->body);
    validate_body(s->else_body);
    for (const auto& p : s->params) validate_expr(p.default_value.get());
    for (const auto& f : s->filters) validate_expr(f.get());
    for (const auto& w : s->with_values) validate_expr(w.get());
  }
}

// A variable scope. Parents are shared so that a macro defined in an inner scope keeps its
// whole chain alive; the interpreter holds those scopes, never the values inside them, so no
// reference cycle forms.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  explicit Interpreter(const Limits& limits) : budget_(limits), active_(budget_) {}

  ~Interpreter() {
    // Namespaces may reference themselves (`{% set ns.self = ns %}`): break such cycles.
    for (auto& ns : namespaces_) ns.as_namespace().attrs.entries.clear();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string run(const Body& program, const Dict& variables) {
    auto globals = std::make_shared<Scope>(nullptr);
    install_globals(*globals);
    auto top = std::make_shared<Scope>(globals);
    for (const auto& [k, v] : variables.entries) top->set(k, v);
    std::string out;
    exec_body(program, top, out);
    return out;
  }

 private:
  // --- output ---------------------------------------------------------------------------------
  void append(std::string& out, const std::string& s) {
    budget_.string_bytes(s.size());
    budget_.check_size(out.size() + s.size());
    out += s;
  }

  // --- statements ------------------------------------------------------------------------------
  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    budget_.step();
    try {
      return exec_inner(s, scope, out);
    } catch (Error& e) {
      e.set_pos_if_unset(s.pos);
      throw;
    }
  }

  Flow exec_inner(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text:
        append(out, s.text);
        return Flow::Normal;
      case Stmt::Kind::Output:
        append(out, to_str(eval(*s.expr, scope)));
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond, scope).truthy()) return exec_body(body, scope, out);
        }
        return exec_body(s.else_body, scope, out);
      case Stmt::Kind::For:
        return exec_for(s, scope, out);
      case Stmt::Kind::Set: {
        Value v = eval(*s.expr, scope);
        if (!s.ns_name.empty()) {
          const Value* ns = scope->find(s.ns_name);
          if (!ns || !ns->is_namespace()) {
            fail("cannot assign attribute on non-namespace object '" + s.ns_name + "'");
          }
          ns->as_namespace().attrs.set(s.attr, std::move(v));
        } else {
          assign(s.targets, v, *scope);
        }
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: {
        std::string captured;
        exec_body(s.body, scope, captured);
        scope->set(s.targets[0], apply_filters(s.filters, Value(std::move(captured)), scope));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        scope->set(s.name, make_macro(s, scope, s.name));
        return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        Value caller = make_macro(s, scope, "caller");
        append(out, to_str(eval_call(*s.expr, scope, &caller)));
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string captured;
        exec_body(s.body, scope, captured);
        append(out, to_str(apply_filters(s.filters, Value(std::move(captured)), scope)));
        return Flow::Normal;
      }
      case Stmt::Kind::With: {
        auto inner = std::make_shared<Scope>(scope);
        for (size_t i = 0; i < s.targets.size(); ++i)
          inner->set(s.targets[i], eval(*s.with_values[i], scope));
        return exec_body(s.body, inner, out);
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  // `set a, b = value` and `for a, b in ...` unpack any iterable of the right length.
  static void assign(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.set(targets[0], v);
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size()) {
      fail(items.size() > targets.size()
               ? "too many values to unpack (expected " + std::to_string(targets.size()) + ")"
               : "not enough values to unpack (expected " + std::to_string(targets.size()) +
                     ", got " + std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], items[i]);
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    // Lists are visited in place (no copy); other iterables are materialized.
    const Value iterable = eval(*s.expr, scope);
    List materialized;
    const List* source = &materialized;
    if (iterable.is_list()) {
      source = &iterable.as_list();
    } else {
      materialized = iterate(iterable);
      budget_.list_items(materialized.size());
    }
    if (s.cond) {  // `for x in xs if cond`: filtered before the loop, so loop.length agrees
      List kept;
      for (const Value& item : *source) {
        budget_.step();
        auto probe = std::make_shared<Scope>(scope);
        assign(s.targets, item, *probe);
        if (eval(*s.cond, probe).truthy()) kept.push_back(item);
      }
      materialized = std::move(kept);
      source = &materialized;
    }
    const List& items = *source;
    if (items.empty()) return exec_body(s.else_body, scope, out);
    const auto n = static_cast<int64_t>(items.size());
    auto index = std::make_shared<int64_t>(0);
    const Value cycle(
        Function{"loop.cycle", [index](CallArgs& a) {
                   if (a.positional.empty()) fail("no items for cycling given");
                   return a.positional[static_cast<size_t>(*index) % a.positional.size()];
                 }});
    for (int64_t i = 0; i < n; ++i) {
      budget_.step();
      *index = i;
      auto body_scope = std::make_shared<Scope>(scope);
      assign(s.targets, items[static_cast<size_t>(i)], *body_scope);
      Dict loop;
      loop.entries.reserve(12);
      loop.entries.emplace_back("index", Value(i + 1));
      loop.entries.emplace_back("index0", Value(i));
      loop.entries.emplace_back("revindex", Value(n - i));
      loop.entries.emplace_back("revindex0", Value(n - i - 1));
      loop.entries.emplace_back("first", Value(i == 0));
      loop.entries.emplace_back("last", Value(i == n - 1));
      loop.entries.emplace_back("length", Value(n));
      loop.entries.emplace_back("depth", Value(int64_t{1}));
      loop.entries.emplace_back("depth0", Value(int64_t{0}));
      if (i > 0) loop.entries.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.entries.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.entries.emplace_back("cycle", cycle);
      body_scope->set("loop", Value(std::move(loop)));
      if (exec_body(s.body, body_scope, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value apply_filters(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope) {
    for (const auto& f : filters) v = apply_filter(*f, std::move(v), scope);
    return v;
  }

  // --- macros ----------------------------------------------------------------------------------
  Value make_macro(const Stmt& def, const ScopePtr& scope, const std::string& name) {
    keep_alive_.push_back(scope);
    Scope* closure = scope.get();
    return Value(Function{
        name, [this, &def, closure](CallArgs& args) { return call_macro(def, closure, args); }});
  }

  Value call_macro(const Stmt& def, Scope* closure, CallArgs& args) {
    if (++call_depth_ > budget_.limits().max_call_depth) {
      --call_depth_;
      fail("maximum macro recursion depth exceeded");
    }
    struct Unwind {
      size_t& d;
      ~Unwind() { --d; }
    } unwind{call_depth_};
    // The closure is kept alive by keep_alive_; share ownership through an aliasing no-op.
    auto scope = std::make_shared<Scope>(ScopePtr(ScopePtr(), closure));
    List varargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < def.params.size()) {
        scope->set(def.params[i].name, args.positional[i]);
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    Dict kwargs;
    Value caller;
    for (auto& [k, v] : args.kwargs) {
      bool is_param = false;
      for (size_t i = 0; i < def.params.size(); ++i) {
        if (def.params[i].name != k) continue;
        if (i < args.positional.size())
          fail("macro '" + def.name + "' got multiple values for argument '" + k + "'");
        is_param = true;
      }
      if (is_param) {
        scope->set(k, v);
      } else if (k == "caller") {
        caller = v;
      } else {
        kwargs.set(k, v);
      }
    }
    for (const Param& p : def.params) {
      bool bound = false;
      for (const auto& [k, v] : scope->vars) bound = bound || k == p.name;
      if (bound) continue;
      scope->set(p.name, p.default_value
                             ? eval(*p.default_value, scope)
                             : Value::undefined("parameter '" + p.name + "' was not provided"));
    }
    scope->set("varargs", Value(std::move(varargs), true));
    scope->set("kwargs", Value(std::move(kwargs)));
    if (!caller.is_undefined()) scope->set("caller", caller);
    std::string out;
    exec_body(def.body, scope, out);
    return Value(std::move(out));
  }

  // --- expressions -----------------------------------------------------------------------------
  Value eval(const Expr& e, const ScopePtr& scope) {
    budget_.step();
    try {
      return eval_inner(e, scope);
    } catch (Error& err) {
      err.set_pos_if_unset(e.pos);
      throw;
    }
  }

  CallArgs eval_args(const Expr& e, size_t first_arg, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = first_arg; i < e.items.size(); ++i)
      args.positional.push_back(eval(*e.items[i], scope));
    for (const auto& [k, v] : e.kwargs) args.kwargs.emplace_back(k, eval(*v, scope));
    return args;
  }

  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
    const Value callee = eval(*e.items[0], scope);
    CallArgs args = eval_args(e, 1, scope);
    if (caller) args.kwargs.emplace_back("caller", *caller);
    if (callee.is_undefined()) fail_undefined(callee);
    if (!callee.is_function()) fail("'" + callee.type_name() + "' object is not callable");
    return callee.as_function().call(args);
  }

  Value apply_filter(const Expr& f, Value input, const ScopePtr& scope) {
    const FilterFn fn = find_filter(f.name);
    if (!fn) fail("no filter named '" + f.name + "'", f.pos);
    const CallArgs args = eval_args(f, 1, scope);
    try {
      return fn(input, args);
    } catch (Error& err) {
      err.set_pos_if_unset(f.pos);
      throw;
    }
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.value;
      case Expr::Kind::Name: {
        if (const Value* v = scope->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List items;
        items.reserve(e.items.size());
        for (const auto& c : e.items) items.push_back(eval(*c, scope));
        return Value(std::move(items), e.kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value k = eval(*e.items[i], scope);
          if (!k.is_string()) fail("only string dictionary keys are supported", e.items[i]->pos);
          d.set(k.as_string(), eval(*e.items[i + 1], scope));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::Attr:
        return get_attr(eval(*e.items[0], scope), e.name);
      case Expr::Kind::Subscript: {
        const Value target = eval(*e.items[0], scope);
        const Expr& key = *e.items[1];
        if (key.kind == Expr::Kind::Slice) {
          auto part = [&](size_t i) {
            return key.items[i] ? eval(*key.items[i], scope) : Value::none();
          };
          return slice(target, part(0), part(1), part(2));
        }
        return get_item(target, eval(key, scope));
      }
      case Expr::Kind::Slice:
        fail("slice outside of a subscript");
      case Expr::Kind::Call:
        return eval_call(e, scope, nullptr);
      case Expr::Kind::Filter:
        return apply_filter(e, eval(*e.items[0], scope), scope);
      case Expr::Kind::Test: {
        const TestFn fn = find_test(e.name);
        if (!fn) fail("no test named '" + e.name + "'");
        const Value input = eval(*e.items[0], scope);
        const CallArgs args = eval_args(e, 1, scope);
        return Value(fn(input, args) != e.negated);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.items[0], scope);
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number())
          fail("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.is_bool() ? Value(v.as_int()) : v;
        if (v.is_float()) return Value(-v.as_double());
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return Value(-v.as_int());
      }
      case Expr::Kind::Binary: {
        if (e.name == "and" || e.name == "or") {  // Python: returns the deciding operand
          Value a = eval(*e.items[0], scope);
          if (a.truthy() == (e.name == "or")) return a;
          return eval(*e.items[1], scope);
        }
        const Value a = eval(*e.items[0], scope);
        const Value b = eval(*e.items[1], scope);
        if (e.name == "~") {
          std::string s = to_str(a);
          const std::string t = to_str(b);
          budget_.string_bytes(s.size() + t.size());
          return Value(s + t);
        }
        return binary_op(e.name, a, b);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.items[0], scope);
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          Value right = eval(*e.items[i + 1], scope);
          const std::string& op = e.compare_ops[i];
          bool r;
          if (op == "==")
            r = equals(left, right);
          else if (op == "!=")
            r = !equals(left, right);
          else if (op == "in")
            r = contains(right, left);
          else if (op == "not in")
            r = !contains(right, left);
          else {
            if (left.is_undefined()) fail_undefined(left);
            if (right.is_undefined()) fail_undefined(right);
            const int c = compare(left, right);
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::CondExpr:
        if (eval(*e.items[1], scope).truthy()) return eval(*e.items[0], scope);
        return e.items[2] ? eval(*e.items[2], scope)
                          : Value::undefined(
                                "the inline if-expression evaluated to false and no else section "
                                "was defined");
    }
    fail("unknown expression");
  }

  // --- globals ---------------------------------------------------------------------------------
  void install_globals(Scope& g) {
    g.set("range", Value(Function{"range", [this](CallArgs& a) { return range(a); }}));
    g.set("namespace", Value(Function{"namespace", [this](CallArgs& a) {
                                        Dict attrs;
                                        for (const Value& p : a.positional) {
                                          if (!p.is_dict())
                                            fail("namespace() positional argument must be a dict");
                                          for (const auto& [k, v] : p.as_dict().entries)
                                            attrs.set(k, v);
                                        }
                                        for (const auto& [k, v] : a.kwargs) attrs.set(k, v);
                                        Value ns = Value::make_namespace(std::move(attrs));
                                        namespaces_.push_back(ns);
                                        return ns;
                                      }}));
    g.set("dict", Value(Function{"dict", [](CallArgs& a) {
                                   Dict d;
                                   for (const Value& p : a.positional) {
                                     if (!p.is_dict())
                                       fail("dict() positional argument must be a dict");
                                     for (const auto& [k, v] : p.as_dict().entries) d.set(k, v);
                                   }
                                   for (const auto& [k, v] : a.kwargs) d.set(k, v);
                                   return Value(std::move(d));
                                 }}));
    g.set("raise_exception",
          Value(Function{"raise_exception", [](CallArgs& a) -> Value {
                           Error err(a.positional.empty() ? std::string("raise_exception() called")
                                                          : to_str(a.positional[0]));
                           err.user_raised = true;
                           throw err;
                         }}));
  }

  Value range(const CallArgs& a) {
    for (const Value& v : a.positional)
      if (!v.is_int() && !v.is_bool())
        fail("range() arguments must be integers, got " + v.type_name());
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else if (a.positional.size() == 2 || a.positional.size() == 3) {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() == 3) step = a.positional[2].as_int();
    } else {
      fail("range expected 1 to 3 arguments");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    // Length without overflow: computed in long double, then bounded by the list limit.
    const long double span =
        step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
    const long double count = span <= 0 ? 0
                                        : (span + (std::abs(static_cast<long double>(step)) - 1)) /
                                              std::abs(static_cast<long double>(step));
    if (count > static_cast<long double>(budget_.limits().max_list_items))
      fail("range() too long for the template limits");
    const auto n = static_cast<int64_t>(count);
    budget_.list_items(static_cast<size_t>(n));
    List out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out.emplace_back(start + i * step);
    return Value(std::move(out));
  }

  Budget budget_;
  ActiveBudget active_;
  size_t call_depth_ = 0;
  std::vector<ScopePtr> keep_alive_;
  std::vector<Value> namespaces_;
};

}  // namespace

void validate(const Body& program) { validate_body(program); }

std::string render(const Body& program, const Dict& variables, const Limits& limits) {
  Interpreter interp(limits);
  return interp.run(program, variables);
}

}  // namespace moe::jinja
