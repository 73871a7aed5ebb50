#include "jinja/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "jinja/builtins.h"
#include "jinja/scope.h"

namespace crescent::jinja {
namespace {

using TT = Token::Type;

// jinja2's statements and tags that crescent refuses, with what they are.
constexpr std::pair<std::string_view, std::string_view> kUnsupportedTags[] = {
    {"macro", "macros"},
    {"call", "call blocks"},
    {"filter", "filter blocks"},
    {"include", "include"},
    {"import", "import"},
    {"from", "from-import"},
    {"extends", "extends"},
    {"block", "template blocks"},
    {"autoescape", "autoescape blocks"},
    {"do", "the do extension (Hugging Face does not load it)"},
    {"trans", "i18n (not loaded)"},
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParserLimits& limits)
      : tokens_(std::move(tokens)), limits_(limits) {}

  Body parse_template() {
    Body body = subparse({});
    return body;
  }

 private:
  // ---- Token stream ----
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const Token& t, std::string_view op) const { return t.type == TT::kOperator && t.text == op; }
  bool is_name(const Token& t, std::string_view name) const { return t.type == TT::kName && t.text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(current(), op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(current(), name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TT::kData:
        return "template data";
      case TT::kVariableBegin:
        return "begin of print statement";
      case TT::kVariableEnd:
        return "end of print statement";
      case TT::kBlockBegin:
        return "begin of statement block";
      case TT::kBlockEnd:
        return "end of statement block";
      case TT::kName:
        return t.text;
      case TT::kString:
        return "string";
      case TT::kInteger:
        return "integer";
      case TT::kFloat:
        return "float";
      case TT::kOperator:
        return t.text;
      case TT::kEof:
        return "end of template";
    }
    return "token";
  }

  [[noreturn]] void fail(const std::string& message, int line) { throw TemplateError(message, line); }

  const Token& expect_op(std::string_view op) {
    if (!is_op(current(), op)) {
      fail(fmt::format("expected token '{}', got '{}'", op, describe(current())), current().line);
    }
    return next();
  }
  const Token& expect_name(std::string_view name = {}) {
    if (current().type != TT::kName || (!name.empty() && current().text != name)) {
      fail(fmt::format("expected token '{}', got '{}'", name.empty() ? "name" : name, describe(current())),
           current().line);
    }
    return next();
  }
  const Token& expect(TT type, std::string_view what) {
    if (current().type != type) {
      fail(fmt::format("expected token '{}', got '{}'", what, describe(current())), current().line);
    }
    return next();
  }

  // ---- Depth guard: statement nesting and expression depth ----
  struct DepthGuard {
    DepthGuard(Parser& p, int line) : p(p) {
      if (++p.depth_ > p.limits_.max_depth) {
        p.fail(fmt::format("the template nests deeper than {} levels", p.limits_.max_depth), line);
      }
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  ExprPtr make(Expr::Kind kind, int line) { return std::make_unique<Expr>(kind, line); }

  // Sets e's tree depth from its children's; a tree deeper than max_expr_depth is refused, so evaluating
  // and analysing it cannot recurse without bound.
  ExprPtr finish(ExprPtr e) {
    int child = 0;
    auto see = [&](const ExprPtr& c) {
      if (c) child = std::max(child, c->depth);
    };
    see(e->a);
    see(e->b);
    see(e->c);
    for (const auto& i : e->items) see(i);
    for (const auto& [k, v] : e->pairs) {
      see(k);
      see(v);
    }
    for (const auto& [k, v] : e->keywords) see(v);
    for (const auto& [op, v] : e->comparisons) see(v);
    e->depth = child + 1;
    if (e->depth > limits_.max_expr_depth) {
      fail(fmt::format("an expression nested deeper than {} levels is not supported", limits_.max_expr_depth),
           e->line);
    }
    return e;
  }

  // ---- Statements ----

  // Statements until a block tag named one of `end_tags` (left current: its name), or EOF when none given.
  Body subparse(const std::vector<std::string_view>& end_tags) {
    Body body;
    std::vector<ExprPtr> outputs;
    int output_line = 0;
    auto flush = [&] {
      if (outputs.empty()) return;
      auto stmt = std::make_unique<Stmt>(Stmt::Kind::kOutput, output_line);
      stmt->outputs = std::move(outputs);
      outputs.clear();
      body.push_back(std::move(stmt));
    };
    for (;;) {
      const Token& t = current();
      if (t.type == TT::kEof) break;
      if (t.type == TT::kData) {
        if (outputs.empty()) output_line = t.line;
        auto e = make(Expr::Kind::kConst, t.line);
        e->value = Value::string(t.text);
        outputs.push_back(std::move(e));
        next();
      } else if (t.type == TT::kVariableBegin) {
        if (outputs.empty()) output_line = t.line;
        next();
        outputs.push_back(parse_tuple(false, true, {}, false));
        expect(TT::kVariableEnd, "end of print statement");
      } else if (t.type == TT::kBlockBegin) {
        flush();
        next();
        if (current().type == TT::kName &&
            std::find(end_tags.begin(), end_tags.end(), current().text) != end_tags.end()) {
          return body;
        }
        parse_statement(body);
        expect(TT::kBlockEnd, "end of statement block");
      } else {
        fail("internal parsing error", t.line);
      }
    }
    flush();
    if (!end_tags.empty()) {
      std::vector<std::string> quoted;
      for (auto t : end_tags) quoted.push_back(fmt::format("'{}'", t));
      fail(fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}.",
                       fmt::join(quoted, " or ")),
           current().line);
    }
    return body;
  }

  // `{% ... %}` body (after its block_begin): `:` optional, block_end, then statements to an end tag.
  Body parse_statements(const std::vector<std::string_view>& end_tags, bool drop_needle) {
    skip_op(":");
    expect(TT::kBlockEnd, "end of statement block");
    Body body = subparse(end_tags);
    if (current().type == TT::kEof) fail("Unexpected end of template", current().line);
    if (drop_needle) next();
    return body;
  }

  void parse_statement(Body& body) {
    const Token& t = current();
    if (t.type != TT::kName) fail("tag name expected", t.line);
    const int line = t.line;
    DepthGuard guard(*this, line);
    const std::string tag = t.text;
    if (tag == "for") return body.push_back(parse_for());
    if (tag == "if") return body.push_back(parse_if());
    if (tag == "set") return body.push_back(parse_set());
    if (tag == "with") return body.push_back(parse_with());
    if (tag == "print") {
      next();
      auto stmt = std::make_unique<Stmt>(Stmt::Kind::kOutput, line);
      while (current().type != TT::kBlockEnd) {
        if (!stmt->outputs.empty()) expect_op(",");
        stmt->outputs.push_back(parse_expression(true));
      }
      return body.push_back(std::move(stmt));
    }
    if (tag == "break" || tag == "continue") {
      next();
      if (loop_contexts_.empty() || !loop_contexts_.back()) {
        fail(fmt::format("'{}' outside a for loop (or inside a set block or generation block within one) is "
                         "not supported",
                         tag),
             line);
      }
      return body.push_back(
          std::make_unique<Stmt>(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line));
    }
    if (tag == "generation") {
      // Hugging Face's AssistantTracker extension: the body renders as is, in a scope of its own (a call
      // block).
      next();
      auto stmt = std::make_unique<Stmt>(Stmt::Kind::kScope, line);
      loop_contexts_.push_back(false);
      stmt->body = parse_statements({"endgeneration"}, true);
      loop_contexts_.pop_back();
      return body.push_back(std::move(stmt));
    }
    if (tag == "raw" || tag == "endraw") fail(fmt::format("a malformed {} tag", tag), line);
    for (const auto& [name, what] : kUnsupportedTags) {
      if (tag == name) fail(fmt::format("'{}' is not supported ({})", tag, what), line);
    }
    fail(fmt::format("Encountered unknown tag '{}'.", tag), line);
  }

  StmtPtr parse_for() {
    const int line = expect_name("for").line;
    auto stmt = std::make_unique<Stmt>(Stmt::Kind::kFor, line);
    stmt->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    stmt->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) stmt->loop_test = parse_expression(true);
    if (is_name(current(), "recursive")) fail("recursive for loops are not supported", current().line);
    loop_contexts_.push_back(true);
    stmt->body = parse_statements({"endfor", "else"}, false);
    loop_contexts_.pop_back();
    if (next().text == "else") stmt->else_body = parse_statements({"endfor"}, true);
    return stmt;
  }

  StmtPtr parse_if() {
    const int line = expect_name("if").line;
    auto stmt = std::make_unique<Stmt>(Stmt::Kind::kIf, line);
    stmt->expr = parse_tuple(false, false, {}, false);
    stmt->body = parse_statements({"elif", "else", "endif"}, false);
    for (;;) {
      const Token& t = next();
      if (t.text == "elif") {
        ExprPtr test = parse_tuple(false, false, {}, false);
        Body body = parse_statements({"elif", "else", "endif"}, false);
        stmt->elifs.emplace_back(std::move(test), std::move(body));
        continue;
      }
      if (t.text == "else") stmt->else_body = parse_statements({"endif"}, true);
      break;
    }
    return stmt;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    ExprPtr target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto stmt = std::make_unique<Stmt>(Stmt::Kind::kAssign, line);
      stmt->target = std::move(target);
      stmt->expr = parse_tuple(false, true, {}, false);
      return stmt;
    }
    auto stmt = std::make_unique<Stmt>(Stmt::Kind::kAssignBlock, line);
    stmt->target = std::move(target);
    stmt->expr = parse_filter(nullptr, false);
    loop_contexts_.push_back(false);
    stmt->body = parse_statements({"endset"}, true);
    loop_contexts_.pop_back();
    return stmt;
  }

  StmtPtr parse_with() {
    const int line = next().line;
    auto stmt = std::make_unique<Stmt>(Stmt::Kind::kWith, line);
    while (current().type != TT::kBlockEnd) {
      if (!stmt->with_targets.empty()) expect_op(",");
      ExprPtr target = parse_assign_target(true, false, {}, false);
      set_ctx(*target, Expr::Ctx::kParam);
      stmt->with_targets.push_back(std::move(target));
      expect_op("=");
      stmt->with_values.push_back(parse_expression(true));
    }
    stmt->body = parse_statements({"endwith"}, true);
    return stmt;
  }

  static void set_ctx(Expr& e, Expr::Ctx ctx) {
    e.ctx = ctx;
    if (e.kind == Expr::Kind::kTuple) {
      for (auto& item : e.items) set_ctx(*item, ctx);
    }
  }

  static bool can_assign(const Expr& e) {
    if (e.kind == Expr::Kind::kName || e.kind == Expr::Kind::kNsRef) return true;
    if (e.kind == Expr::Kind::kTuple) {
      return std::all_of(e.items.begin(), e.items.end(), [](const ExprPtr& i) { return can_assign(*i); });
    }
    return false;
  }

  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string_view>& extra_end,
                              bool with_namespace) {
    ExprPtr target;
    if (with_namespace && look().type == TT::kOperator && look().text == ".") {
      const Token& name = expect_name();
      const int line = name.line;
      std::string ns = name.text;
      next();  // .
      target = make(Expr::Kind::kNsRef, line);
      target->name = std::move(ns);
      target->attr = expect_name().text;
    } else if (name_only) {
      const Token& name = expect_name();
      target = make(Expr::Kind::kName, name.line);
      target->name = name.text;
      target->ctx = Expr::Ctx::kStore;
    } else {
      target = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
      set_ctx(*target, Expr::Ctx::kStore);
    }
    if (!can_assign(*target)) fail("can't assign to this expression", target->line);
    return target;
  }

  // ---- Expressions (jinja2's precedence: condexpr, or, and, not, compare, +/-, ~, * / // %, **, unary,
  // then primary with postfix and filters/tests) ----

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this, current().line);
    int line = current().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto e = make(Expr::Kind::kCondExpr, line);
      e->a = std::move(expr2);  // the test
      e->b = std::move(expr1);
      e->c = std::move(expr3);
      expr1 = finish(std::move(e));
      line = current().line;
    }
    return expr1;
  }

  ExprPtr binary_node(Expr::Kind kind, ExprPtr left, ExprPtr right, int line) {
    auto e = make(kind, line);
    e->a = std::move(left);
    e->b = std::move(right);
    return finish(std::move(e));
  }

  ExprPtr parse_or() {
    int line = current().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      ExprPtr right = parse_and();
      left = binary_node(Expr::Kind::kOr, std::move(left), std::move(right), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = current().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      ExprPtr right = parse_not();
      left = binary_node(Expr::Kind::kAnd, std::move(left), std::move(right), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name(current(), "not")) {
      const int line = next().line;
      DepthGuard guard(*this, line);
      auto e = make(Expr::Kind::kNot, line);
      e->a = parse_not();
      return finish(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = current().line;
    ExprPtr expr = parse_math1();
    std::vector<std::pair<Expr::CmpOp, ExprPtr>> ops;
    for (;;) {
      const Token& t = current();
      std::optional<Expr::CmpOp> op;
      if (t.type == TT::kOperator) {
        if (t.text == "==") op = Expr::CmpOp::kEq;
        if (t.text == "!=") op = Expr::CmpOp::kNe;
        if (t.text == "<") op = Expr::CmpOp::kLt;
        if (t.text == "<=") op = Expr::CmpOp::kLe;
        if (t.text == ">") op = Expr::CmpOp::kGt;
        if (t.text == ">=") op = Expr::CmpOp::kGe;
        if (op) next();
      } else if (is_name(t, "in")) {
        next();
        op = Expr::CmpOp::kIn;
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        next();
        next();
        op = Expr::CmpOp::kNotIn;
      }
      if (!op) break;
      ops.emplace_back(*op, parse_math1());
      if (ops.size() > static_cast<size_t>(limits_.max_depth))
        fail("a comparison chain that long is not supported", t.line);
      line = current().line;
    }
    if (ops.empty()) return expr;
    auto e = make(Expr::Kind::kCompare, line);
    e->a = std::move(expr);
    e->comparisons = std::move(ops);
    return finish(std::move(e));
  }

  ExprPtr parse_binary_level(Expr::BinOp (*op_of)(const Token&, bool&), ExprPtr (Parser::*operand)()) {
    int line = current().line;
    ExprPtr left = (this->*operand)();
    for (;;) {
      bool matched = false;
      const Expr::BinOp op = op_of(current(), matched);
      if (!matched) break;
      next();
      ExprPtr right = (this->*operand)();
      left = binary_node(Expr::Kind::kBinary, std::move(left), std::move(right), line);
      left->bin_op = op;
      line = current().line;
    }
    return left;
  }

  static Expr::BinOp math1_op(const Token& t, bool& matched) {
    matched = t.type == TT::kOperator && (t.text == "+" || t.text == "-");
    return t.text == "+" ? Expr::BinOp::kAdd : Expr::BinOp::kSub;
  }
  static Expr::BinOp math2_op(const Token& t, bool& matched) {
    matched = t.type == TT::kOperator && (t.text == "*" || t.text == "/" || t.text == "//" || t.text == "%");
    if (t.text == "*") return Expr::BinOp::kMul;
    if (t.text == "/") return Expr::BinOp::kDiv;
    if (t.text == "//") return Expr::BinOp::kFloorDiv;
    return Expr::BinOp::kMod;
  }
  static Expr::BinOp pow_op(const Token& t, bool& matched) {
    matched = t.type == TT::kOperator && t.text == "**";
    return Expr::BinOp::kPow;
  }

  ExprPtr parse_math1() { return parse_binary_level(math1_op, &Parser::parse_concat); }

  ExprPtr parse_concat() {
    const int line = current().line;
    std::vector<ExprPtr> args;
    args.push_back(parse_math2());
    while (skip_op("~")) args.push_back(parse_math2());
    if (args.size() == 1) return std::move(args[0]);
    auto e = make(Expr::Kind::kConcat, line);
    e->items = std::move(args);
    return finish(std::move(e));
  }

  ExprPtr parse_math2() { return parse_binary_level(math2_op, &Parser::parse_pow); }
  ExprPtr parse_pow() { return parse_binary_level(pow_op, &Parser::parse_unary_with_filter); }
  ExprPtr parse_unary_with_filter() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    const Token& t = current();
    const int line = t.line;
    ExprPtr node;
    if (is_op(t, "-") || is_op(t, "+")) {
      const bool neg = t.text == "-";
      next();
      DepthGuard guard(*this, line);
      node = make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      node->a = parse_unary(false);
      node = finish(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    const int line = t.line;
    if (t.type == TT::kName) {
      ExprPtr node;
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        node = make(Expr::Kind::kConst, line);
        node->value = Value::boolean(t.text == "true" || t.text == "True");
      } else if (t.text == "none" || t.text == "None") {
        node = make(Expr::Kind::kConst, line);
        node->value = Value::none();
      } else {
        node = make(Expr::Kind::kName, line);
        node->name = t.text;
      }
      next();
      return node;
    }
    if (t.type == TT::kString) {
      std::string s;
      while (current().type == TT::kString) s += next().text;
      auto node = make(Expr::Kind::kConst, line);
      node->value = Value::string(std::move(s));
      return node;
    }
    if (t.type == TT::kInteger || t.type == TT::kFloat) {
      auto node = make(Expr::Kind::kConst, line);
      node->value = t.type == TT::kInteger ? Value::integer(t.int_value) : Value::floating(t.float_value);
      next();
      return node;
    }
    if (is_op(t, "(")) {
      next();
      DepthGuard guard(*this, line);
      ExprPtr node = parse_tuple(false, true, {}, true);
      expect_op(")");
      return node;
    }
    if (is_op(t, "[")) return parse_list();
    if (is_op(t, "{")) return parse_dict();
    fail(fmt::format("unexpected '{}'", describe(t)), line);
  }

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    const Token& t = current();
    if (t.type == TT::kVariableEnd || t.type == TT::kBlockEnd || is_op(t, ")")) return true;
    return t.type == TT::kName && std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string_view>& extra_end,
                      bool explicit_parentheses) {
    int line = current().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    for (;;) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(current(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
      line = current().line;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) {
        fail(fmt::format("Expected an expression, got '{}'", describe(current())), current().line);
      }
    }
    auto e = make(Expr::Kind::kTuple, line);
    e->items = std::move(args);
    return finish(std::move(e));
  }

  ExprPtr parse_list() {
    const int line = expect_op("[").line;
    DepthGuard guard(*this, line);
    auto e = make(Expr::Kind::kList, line);
    while (!is_op(current(), "]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op(current(), "]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return finish(std::move(e));
  }

  ExprPtr parse_dict() {
    const int line = expect_op("{").line;
    DepthGuard guard(*this, line);
    auto e = make(Expr::Kind::kDict, line);
    while (!is_op(current(), "}")) {
      if (!e->pairs.empty()) expect_op(",");
      if (is_op(current(), "}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      ExprPtr value = parse_expression(true);
      e->pairs.emplace_back(std::move(key), std::move(value));
    }
    expect_op("}");
    return finish(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      const Token& t = current();
      if (is_op(t, ".") || is_op(t, "[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op(t, "(")) {
        node = parse_call(std::move(node));
      } else {
        break;
      }
    }
    return node;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      const Token& t = current();
      if (is_op(t, "|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name(t, "is")) {
        node = parse_test(std::move(node));
      } else if (is_op(t, "(")) {
        node = parse_call(std::move(node));
      } else {
        break;
      }
    }
    return node;
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    const int line = t.line;
    if (t.text == ".") {
      const Token& attr = current();
      if (attr.type == TT::kName) {
        next();
        auto e = make(Expr::Kind::kGetattr, line);
        e->a = std::move(node);
        e->name = attr.text;
        return finish(std::move(e));
      }
      if (attr.type != TT::kInteger) fail("expected name or number", attr.line);
      next();
      auto e = make(Expr::Kind::kGetitem, line);
      e->a = std::move(node);
      e->b = make(Expr::Kind::kConst, attr.line);
      e->b->value = Value::integer(attr.int_value);
      return finish(std::move(e));
    }
    // [
    DepthGuard guard(*this, line);
    std::vector<ExprPtr> args;
    while (!is_op(current(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(Expr::Kind::kGetitem, line);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      fail("subscripts with several indexes (a tuple key) are not supported", line);
    }
    return finish(std::move(e));
  }

  ExprPtr parse_subscribed() {
    const int line = current().line;
    ExprPtr start;
    if (is_op(current(), ":")) {
      next();
    } else {
      ExprPtr node = parse_expression(true);
      if (!is_op(current(), ":")) return node;
      next();
      start = std::move(node);
    }
    auto slice = make(Expr::Kind::kSlice, line);
    slice->a = std::move(start);
    if (!is_op(current(), ":") && !is_op(current(), "]") && !is_op(current(), ","))
      slice->b = parse_expression(true);
    if (is_op(current(), ":")) {
      next();
      if (!is_op(current(), "]") && !is_op(current(), ",")) slice->c = parse_expression(true);
    }
    return finish(std::move(slice));
  }

  void parse_call_args(Expr& e) {
    const Token& open = expect_op("(");
    const int line = open.line;
    DepthGuard guard(*this, line);
    bool require_comma = false;
    while (!is_op(current(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(current(), ")")) break;
      }
      if (is_op(current(), "*") || is_op(current(), "**")) {
        fail(fmt::format("'{}' arguments in calls are not supported", current().text), current().line);
      }
      if (current().type == TT::kName && is_op(look(), "=")) {
        std::string key = next().text;
        next();
        for (const auto& [k, v] : e.keywords) {
          if (k == key) fail(fmt::format("keyword argument repeated: {}", key), line);
        }
        e.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.keywords.empty()) fail("invalid syntax for function call expression", line);
        e.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::kCall, current().line);
    e->a = std::move(node);
    parse_call_args(*e);
    return finish(std::move(e));
  }

  // Filters applied to `node` (null in `{% set x | f %}...{% endset %}`: to the block's text).
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op(current(), "|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& name = expect_name();
      std::string filter = name.text;
      while (is_op(current(), ".")) {
        next();
        filter += "." + expect_name().text;
      }
      bool jinja2_has = false;
      const int index = find_filter(filter, jinja2_has);
      if (index < 0) {
        fail(jinja2_has ? fmt::format("the filter '{}' is not supported", filter)
                        : fmt::format("No filter named '{}'.", filter),
             name.line);
      }
      auto e = make(Expr::Kind::kFilter, name.line);
      e->name = filter;
      e->slot = index;
      e->a = std::move(node);
      if (is_op(current(), "(")) parse_call_args(*e);
      node = finish(std::move(e));
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;  // is
    const bool negated = skip_name("not");
    const Token& name = expect_name();
    std::string test = name.text;
    while (is_op(current(), ".")) {
      next();
      test += "." + expect_name().text;
    }
    bool jinja2_has = false;
    const int index = find_test(test, jinja2_has);
    if (index < 0) {
      fail(jinja2_has ? fmt::format("the test '{}' is not supported", test)
                      : fmt::format("No test named '{}'.", test),
           name.line);
    }
    auto e = make(Expr::Kind::kTest, line);
    e->name = test;
    e->slot = index;
    e->a = std::move(node);
    const Token& t = current();
    if (is_op(t, "(")) {
      parse_call_args(*e);
    } else if ((t.type == TT::kName || t.type == TT::kString || t.type == TT::kInteger ||
                t.type == TT::kFloat || is_op(t, "(") || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
      if (is_name(t, "is")) fail("You cannot chain multiple tests with is", t.line);
      ExprPtr arg = parse_primary();
      e->items.push_back(parse_postfix(std::move(arg)));
    }
    e = finish(std::move(e));
    if (!negated) return e;
    auto n = make(Expr::Kind::kNot, line);
    n->a = std::move(e);
    return finish(std::move(n));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  const ParserLimits& limits_;
  int depth_ = 0;
  std::vector<bool> loop_contexts_;  // innermost last: true in a for body, false in set/generation blocks
};

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source, const LexerOptions& lexer_options,
                                       const ParserLimits& limits) {
  Parser parser(tokenize(source, lexer_options), limits);
  auto program = std::make_unique<Program>();
  program->body = parser.parse_template();
  analyze_scopes(*program);
  return program;
}

}  // namespace crescent::jinja
