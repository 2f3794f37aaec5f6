#include "coordinator/chat_template/jinja_parser.h"

#include <initializer_list>
#include <string_view>

#include "coordinator/chat_template/jinja_error.h"

namespace moe::jinja {
namespace {

ExprPtr make_expr(Expr::Kind kind, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

StmtPtr make_stmt(Stmt::Kind kind, size_t pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->pos = pos;
  return s;
}

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::Text:
      return "template text";
    case TokenType::VarBegin:
      return "'{{'";
    case TokenType::VarEnd:
      return "'}}'";
    case TokenType::BlockBegin:
      return "'{%'";
    case TokenType::BlockEnd:
      return "'%}'";
    case TokenType::End:
      return "end of template";
    case TokenType::String:
      return "string literal";
    case TokenType::Int:
    case TokenType::Float:
      return "number '" + t.value + "'";
    default:
      return "'" + t.value + "'";
  }
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, size_t max_nesting)
      : t_(std::move(tokens)), max_nesting_(max_nesting) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  // --- token helpers -------------------------------------------------------------------------
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::Op && cur().value == op; }
  bool is_name(std::string_view n) const {
    return cur().type == TokenType::Name && cur().value == n;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail("expected " + expected + ", got " + describe(cur()), cur().pos);
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) unexpected("'%}'");
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) unexpected("a name");
    return next().value;
  }

  // Nesting guard: deeply nested input must not overflow the C++ stack.
  struct Nest {
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > p_.max_nesting_) fail("template nested too deeply", p_.cur().pos);
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
    Parser& p_;
  };

  // --- statements ----------------------------------------------------------------------------
  // Parses until a block tag whose keyword is in `ends`; leaves the keyword as current token.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string* which) {
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::End:
          if (ends.size() != 0) {
            fail("unexpected end of template, expected '" + std::string(*ends.begin()) + "'",
                 t.pos);
          }
          return body;
        case TokenType::Text: {
          auto s = make_stmt(Stmt::Kind::Text, t.pos);
          s->text = next().value;
          body.push_back(std::move(s));
          break;
        }
        case TokenType::VarBegin: {
          auto s = make_stmt(Stmt::Kind::Output, next().pos);
          s->expr = parse_tuple(true);
          if (cur().type != TokenType::VarEnd) unexpected("'}}'");
          next();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::BlockBegin: {
          const Token& kw = peek();
          if (kw.type != TokenType::Name) {
            next();
            unexpected("a statement name");
          }
          for (std::string_view e : ends) {
            if (kw.value == e) {
              next();
              *which = kw.value;
              return body;
            }
          }
          next();
          body.push_back(parse_statement());
          break;
        }
        default:
          unexpected("template text or a tag");
      }
    }
  }

  // Consumes the end keyword `kw` and the closing "%}".
  void end_block() {
    next();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& kw = cur();
    const std::string name = kw.value;
    const size_t pos = kw.pos;
    next();
    if (name == "if") return parse_if(pos);
    if (name == "for") return parse_for(pos);
    if (name == "set") return parse_set(pos);
    if (name == "macro") return parse_macro(pos);
    if (name == "call") return parse_call_block(pos);
    if (name == "filter") return parse_filter_block(pos);
    if (name == "with") return parse_with(pos);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop", pos);
      expect_block_end();
      return make_stmt(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, pos);
    }
    static constexpr std::string_view kUnsupported[] = {"include", "import",     "from", "extends",
                                                        "block",   "autoescape", "do",   "trans"};
    for (std::string_view u : kUnsupported) {
      if (name == u) fail("unsupported tag '" + name + "'", pos);
    }
    fail("unknown tag '" + name + "'", pos);
  }

  StmtPtr parse_if(size_t pos) {
    auto s = make_stmt(Stmt::Kind::If, pos);
    ExprPtr cond = parse_tuple(true);
    expect_block_end();
    while (true) {
      std::string which;
      Body body = parse_body({"elif", "else", "endif"}, &which);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (which == "elif") {
        next();
        cond = parse_tuple(true);
        expect_block_end();
        continue;
      }
      if (which == "else") {
        end_block();
        s->else_body = parse_body({"endif"}, &which);
      }
      end_block();
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(size_t pos) {
    auto s = make_stmt(Stmt::Kind::For, pos);
    s->targets = parse_targets();
    if (!skip_name("in")) unexpected("'in'");
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail("recursive loops are not supported", cur().pos);
    expect_block_end();
    ++loop_depth_;
    std::string which;
    s->body = parse_body({"else", "endfor"}, &which);
    --loop_depth_;
    if (which == "else") {
      end_block();
      s->else_body = parse_body({"endfor"}, &which);
    }
    end_block();
    return s;
  }

  StmtPtr parse_set(size_t pos) {
    auto s = make_stmt(Stmt::Kind::Set, pos);
    const std::string first = expect_name();
    if (skip_op(".")) {
      s->ns_name = first;
      s->attr = expect_name();
    } else {
      s->targets.push_back(first);
      while (skip_op(",")) s->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (!s->ns_name.empty() || s->targets.size() != 1) unexpected("'='");
    s->kind = Stmt::Kind::SetBlock;
    while (skip_op("|")) s->filters.push_back(parse_filter_call(nullptr));
    expect_block_end();
    std::string which;
    s->body = parse_body({"endset"}, &which);
    end_block();
    return s;
  }

  std::vector<Param> parse_params() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro(size_t pos) {
    auto s = make_stmt(Stmt::Kind::Macro, pos);
    s->name = expect_name();
    s->params = parse_params();
    expect_block_end();
    const size_t saved = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot cross a macro boundary
    std::string which;
    s->body = parse_body({"endmacro"}, &which);
    loop_depth_ = saved;
    next();
    if (cur().type == TokenType::Name) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(size_t pos) {
    auto s = make_stmt(Stmt::Kind::CallBlock, pos);
    if (is_op("(")) s->params = parse_params();
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) fail("expected a call in {% call %}", s->expr->pos);
    expect_block_end();
    const size_t saved = loop_depth_;
    loop_depth_ = 0;
    std::string which;
    s->body = parse_body({"endcall"}, &which);
    loop_depth_ = saved;
    end_block();
    return s;
  }

  StmtPtr parse_filter_block(size_t pos) {
    auto s = make_stmt(Stmt::Kind::FilterBlock, pos);
    do {
      s->filters.push_back(parse_filter_call(nullptr));
    } while (skip_op("|"));
    expect_block_end();
    std::string which;
    s->body = parse_body({"endfilter"}, &which);
    end_block();
    return s;
  }

  StmtPtr parse_with(size_t pos) {
    auto s = make_stmt(Stmt::Kind::With, pos);
    while (cur().type != TokenType::BlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(expect_name());
      expect_op("=");
      s->with_values.push_back(parse_expression(true));
    }
    expect_block_end();
    std::string which;
    s->body = parse_body({"endwith"}, &which);
    end_block();
    return s;
  }

  // --- expressions ---------------------------------------------------------------------------
  bool at_tuple_end() const {
    const Token& t = cur();
    return t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd ||
           (t.type == TokenType::Op && (t.value == ")" || t.value == "]" || t.value == "}")) ||
           (t.type == TokenType::Name && (t.value == "if" || t.value == "recursive"));
  }

  // "a, b" without parentheses is a tuple in {{ }}, set values and for iterables.
  ExprPtr parse_tuple(bool with_condexpr) {
    const size_t pos = cur().pos;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = make_expr(Expr::Kind::Tuple, pos);
    tuple->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (at_tuple_end()) break;
      tuple->items.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const size_t pos = next().pos;
      auto c = make_expr(Expr::Kind::CondExpr, pos);
      c->items.push_back(std::move(e));
      c->items.push_back(parse_or());
      c->items.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, size_t pos, ExprPtr a, ExprPtr b) {
    auto e = make_expr(Expr::Kind::Binary, pos);
    e->name = std::move(op);
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary("or", pos, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary("and", pos, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      auto e = make_expr(Expr::Kind::Unary, next().pos);
      e->name = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const size_t pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::Op &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::Name && peek().value == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(Expr::Kind::Compare, pos);
        cmp->items.push_back(std::move(first));
      }
      cmp->compare_ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.value, t.pos, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const size_t pos = next().pos;
      e = binary("~", pos, std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.value, t.pos, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const size_t pos = next().pos;
      e = binary("**", pos, std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make_expr(Expr::Kind::Unary, t.pos);
      e->name = t.value;
      e->items.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::Name: {
        next();
        auto e = make_expr(Expr::Kind::Literal, t.pos);
        if (t.value == "true" || t.value == "True") {
          e->value = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->value = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::Name;
          e->name = t.value;
        }
        return e;
      }
      case TokenType::String: {
        auto e = make_expr(Expr::Kind::Literal, t.pos);
        std::string s;
        while (cur().type == TokenType::String) s += next().value;  // adjacent literals join
        e->value = Value(std::move(s));
        return e;
      }
      case TokenType::Int:
      case TokenType::Float: {
        next();
        auto e = make_expr(Expr::Kind::Literal, t.pos);
        e->value = t.type == TokenType::Int ? Value(t.int_value) : Value(t.float_value);
        return e;
      }
      case TokenType::Op:
        if (t.value == "(") return parse_paren();
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_paren() {
    const size_t pos = next().pos;
    if (skip_op(")")) return make_expr(Expr::Kind::Tuple, pos);
    ExprPtr first = parse_expression(true);
    if (skip_op(")")) return first;
    auto tuple = make_expr(Expr::Kind::Tuple, pos);
    tuple->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (is_op(")")) break;
      tuple->items.push_back(parse_expression(true));
    }
    expect_op(")");
    return tuple;
  }

  ExprPtr parse_list() {
    auto e = make_expr(Expr::Kind::List, next().pos);
    while (!is_op("]")) {
      e->items.push_back(parse_expression(true));
      if (!skip_op(",")) break;
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(Expr::Kind::Dict, next().pos);
    while (!is_op("}")) {
      ExprPtr key = parse_expression(true);
      expect_op(":");
      e->items.push_back(std::move(key));
      e->items.push_back(parse_expression(true));
      if (!skip_op(",")) break;
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        next();
        if (cur().type == TokenType::Int) {  // x.0 is x[0]
          auto sub = make_expr(Expr::Kind::Subscript, e->pos);
          auto idx = make_expr(Expr::Kind::Literal, cur().pos);
          idx->value = Value(next().int_value);
          sub->items.push_back(std::move(e));
          sub->items.push_back(std::move(idx));
          e = std::move(sub);
          continue;
        }
        auto a = make_expr(Expr::Kind::Attr, e->pos);
        a->name = expect_name();
        a->items.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    next();
    auto sub = make_expr(Expr::Kind::Subscript, target->pos);
    sub->items.push_back(std::move(target));
    // Either an index expression or a slice start:stop:step (each part optional).
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      is_slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
      if (skip_op(":") && !is_op("]")) parts[2] = parse_expression(true);
    }
    expect_op("]");
    if (!is_slice) {
      sub->items.push_back(std::move(parts[0]));
      return sub;
    }
    auto slice = make_expr(Expr::Kind::Slice, sub->pos);
    for (auto& p : parts) slice->items.push_back(std::move(p));
    sub->items.push_back(std::move(slice));
    return sub;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        fail("*args and **kwargs in calls are not supported", cur().pos);
      if (cur().type == TokenType::Name && peek().type == TokenType::Op && peek().value == "=") {
        std::string name = next().value;
        next();
        call.kwargs.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!call.kwargs.empty()) fail("positional argument follows keyword argument", cur().pos);
        call.items.push_back(parse_expression(true));
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr target) {
    auto call = make_expr(Expr::Kind::Call, target->pos);
    call->items.push_back(std::move(target));
    parse_call_args(*call);
    return call;
  }

  // "name" or "name(args)" after a "|"; input is items[0] (null for filter blocks / set blocks).
  ExprPtr parse_filter_call(ExprPtr input) {
    auto f = make_expr(Expr::Kind::Filter, cur().pos);
    f->name = expect_name();
    while (skip_op(".")) f->name += "." + expect_name();
    f->items.push_back(std::move(input));
    if (is_op("(")) parse_call_args(*f);
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        e = parse_filter_call(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr input) {
    auto t = make_expr(Expr::Kind::Test, next().pos);
    t->negated = skip_name("not");
    t->name = expect_name();
    while (skip_op(".")) t->name += "." + expect_name();
    t->items.push_back(std::move(input));
    if (is_op("(")) {
      parse_call_args(*t);
    } else {
      // One argument without parentheses ("is divisibleby 3", "is sameas false").
      const Token& c = cur();
      const bool arg_start =
          c.type == TokenType::Name || c.type == TokenType::String || c.type == TokenType::Int ||
          c.type == TokenType::Float ||
          (c.type == TokenType::Op && (c.value == "(" || c.value == "[" || c.value == "{"));
      if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
        if (is_name("is")) unexpected("a test argument");
        t->items.push_back(parse_postfix(parse_primary()));
      }
    }
    return t;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  size_t depth_ = 0;
  size_t max_nesting_;
  size_t loop_depth_ = 0;
};

}  // namespace

Body parse(std::vector<Token> tokens, size_t max_nesting) {
  return Parser(std::move(tokens), max_nesting).parse_template();
}

}  // namespace moe::jinja
