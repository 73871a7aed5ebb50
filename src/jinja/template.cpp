#include "jinja/template.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/parser.h"

namespace crescent::jinja {
namespace {

// Runs a Program: jinja2's generated code, node by node. Variables live in slots (scope.h); a slot
// without a value is jinja2's `missing` (an Undefined when read).
class Renderer {
 public:
  Renderer(const Program& program, std::unordered_map<std::string, Value> variables, Env& env,
           size_t max_output_bytes)
      : program_(program),
        variables_(std::move(variables)),
        env_(env),
        max_output_bytes_(max_output_bytes),
        slots_(static_cast<size_t>(program.slot_count)),
        present_(static_cast<size_t>(program.slot_count), false) {}

  std::string run() {
    std::string out;
    out_ = &out;
    enter(program_.root_frame);
    exec_body(program_.body);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // ---- Frames ----

  Value lookup_context(const std::string& name, bool& found) {
    if (auto it = variables_.find(name); it != variables_.end()) {
      found = true;
      return it->second;
    }
    return find_global(name, found, env_);
  }

  void set_slot(int slot, Value v) {
    slots_[static_cast<size_t>(slot)] = std::move(v);
    present_[static_cast<size_t>(slot)] = true;
  }

  void enter(const Frame& frame) {
    for (const LoadInstr& load : frame.loads) {
      const auto slot = static_cast<size_t>(load.slot);
      switch (load.kind) {
        case LoadInstr::Kind::kParam:
          break;
        case LoadInstr::Kind::kResolve: {
          bool found = false;
          Value v = lookup_context(load.name, found);
          slots_[slot] = found ? std::move(v) : Value();
          present_[slot] = found;
          break;
        }
        case LoadInstr::Kind::kAlias:
          slots_[slot] = slots_[static_cast<size_t>(load.alias_slot)];
          present_[slot] = present_[static_cast<size_t>(load.alias_slot)];
          break;
        case LoadInstr::Kind::kUndefined:
          slots_[slot] = Value();
          present_[slot] = false;
          break;
      }
    }
  }

  void leave(const Frame& frame) {
    for (const LoadInstr& load : frame.loads) {
      slots_[static_cast<size_t>(load.slot)] = Value();
      present_[static_cast<size_t>(load.slot)] = false;
    }
  }

  // ---- Output ----

  void emit(std::string_view text) {
    if (out_->size() + text.size() > max_output_bytes_) {
      throw TemplateError(fmt::format("the rendered text is over the limit of {} bytes", max_output_bytes_));
    }
    out_->append(text);
  }

  // ---- Statements ----

  Flow exec_body(const Body& body) {
    for (const StmtPtr& stmt : body) {
      const Flow flow = exec(*stmt);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& st) {
    try {
      env_.step();
      return exec_unchecked(st);
    } catch (TemplateError& e) {
      if (e.line == 0) e.line = st.line;
      throw;
    }
  }

  Flow exec_unchecked(const Stmt& st) {
    switch (st.kind) {
      case Stmt::Kind::kOutput:
        for (const ExprPtr& e : st.outputs) {
          if (e->kind == Expr::Kind::kConst && e->value.is_string()) {
            emit(e->value.as_string());
          } else {
            const Value v = eval(*e);
            if (v.is_string()) {
              emit(v.as_string());
            } else {
              emit(to_str(v));
            }
          }
        }
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        if (truthy(eval(*st.expr))) return exec_body(st.body);
        for (const auto& [test, body] : st.elifs) {
          if (truthy(eval(*test))) return exec_body(body);
        }
        return exec_body(st.else_body);
      case Stmt::Kind::kFor:
        return exec_for(st);
      case Stmt::Kind::kAssign: {
        if (st.target->kind == Expr::Kind::kNsRef) check_namespace(*st.target);
        Value v = eval(*st.expr);
        assign(*st.target, std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kAssignBlock: {
        enter(st.frame);
        std::string captured;
        std::string* outer = out_;
        out_ = &captured;
        try {
          exec_body(st.body);
        } catch (...) {
          out_ = outer;
          throw;
        }
        out_ = outer;
        Value v = Value::string(std::move(captured));
        if (st.expr) v = eval_filter(*st.expr, &v);
        if (st.target->kind == Expr::Kind::kNsRef) check_namespace(*st.target);
        assign(*st.target, std::move(v));
        leave(st.frame);
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        enter(st.frame);
        for (size_t i = 0; i < st.with_targets.size(); ++i)
          assign(*st.with_targets[i], eval(*st.with_values[i]));
        const Flow flow = exec_body(st.body);
        leave(st.frame);
        return flow;
      }
      case Stmt::Kind::kScope: {
        enter(st.frame);
        exec_body(st.body);
        leave(st.frame);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& st) {
    const Value iterable = eval(*st.expr);
    if (iterable.kind() == Value::Kind::kLoop)
      throw TemplateError("iterating a loop object is not supported");
    ValueList items = iterate(iterable);
    if (st.loop_test) {
      enter(st.test_frame);
      ValueList kept;
      for (Value& item : items) {
        env_.step();
        assign(*st.target, item);
        if (truthy(eval(*st.loop_test))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (!st.else_body.empty()) {
        enter(st.else_frame);
        const Flow flow = exec_body(st.else_body);
        leave(st.else_frame);
        return flow;
      }
      return Flow::kNormal;
    }
    auto state = std::make_shared<LoopState>();
    state->items = std::make_shared<const ValueList>(std::move(items));
    const Value loop = Value::loop(state);
    for (size_t i = 0; i < state->items->size(); ++i) {
      env_.step();
      state->index0 = static_cast<int64_t>(i);
      assign(*st.target, (*state->items)[i]);
      set_slot(st.loop_slot, loop);
      enter(st.frame);
      if (exec_body(st.body) == Flow::kBreak) break;
    }
    leave(st.frame);
    return Flow::kNormal;
  }

  void check_namespace(const Expr& ns_ref) {
    const auto slot = static_cast<size_t>(ns_ref.slot);
    if (!present_[slot] || slots_[slot].kind() != Value::Kind::kNamespace) {
      throw TemplateError("cannot assign attribute on non-namespace object");
    }
  }

  void assign(const Expr& target, Value v) {
    switch (target.kind) {
      case Expr::Kind::kName:
        set_slot(target.slot, std::move(v));
        return;
      case Expr::Kind::kNsRef: {
        check_namespace(target);
        NamespaceState& ns = slots_[static_cast<size_t>(target.slot)].as_namespace();
        if (Value* existing = ns.find(target.attr)) {
          *existing = std::move(v);
        } else {
          ns.attrs.emplace_back(target.attr, std::move(v));
        }
        return;
      }
      case Expr::Kind::kTuple: {
        if (v.is_undefined()) throw TemplateError(v.undefined_hint());
        const ValueList items = iterate(v);
        if (items.size() != target.items.size()) {
          throw TemplateError(
              items.size() > target.items.size()
                  ? fmt::format("too many values to unpack (expected {})", target.items.size())
                  : fmt::format("not enough values to unpack (expected {}, got {})", target.items.size(),
                                items.size()));
        }
        for (size_t i = 0; i < items.size(); ++i) assign(*target.items[i], items[i]);
        return;
      }
      default:
        throw TemplateError("cannot assign to this expression");
    }
  }

  // ---- Expressions ----

  Value eval(const Expr& e) {
    try {
      return eval_unchecked(e);
    } catch (TemplateError& error) {
      if (error.line == 0) error.line = e.line;
      throw;
    }
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs args;
    args.positional.reserve(e.items.size());
    for (const ExprPtr& item : e.items) args.positional.push_back(eval(*item));
    for (const auto& [key, value] : e.keywords) args.keywords.emplace_back(key, eval(*value));
    return args;
  }

  // A filter chain; the innermost operand is `block_text` when the filter has none (a set block's).
  Value eval_filter(const Expr& e, const Value* block_text) {
    Value operand;
    if (e.a) {
      operand = e.a->kind == Expr::Kind::kFilter ? eval_filter(*e.a, block_text) : eval(*e.a);
    } else if (block_text != nullptr) {
      operand = *block_text;
    }
    CallArgs args = eval_args(e);
    return apply_filter(e.slot, env_, operand, args);
  }

  Value eval_unchecked(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kConst:
        return e.value;
      case Expr::Kind::kName: {
        const auto slot = static_cast<size_t>(e.slot);
        if (!present_[slot]) return Value::undefined(fmt::format("'{}' is undefined", e.name));
        return slots_[slot];
      }
      case Expr::Kind::kTuple:
      case Expr::Kind::kList: {
        ValueList items;
        items.reserve(e.items.size());
        for (const ExprPtr& item : e.items) items.push_back(eval(*item));
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple ? SeqKind::kTuple : SeqKind::kList);
      }
      case Expr::Kind::kDict: {
        DictEntries entries;
        for (const auto& [k, v] : e.pairs) {
          const Value key = eval(*k);
          if (!key.is_string()) {
            throw TemplateError(
                fmt::format("dict keys other than strings are not supported (a {})", key.type_name()));
          }
          Value value = eval(*v);
          bool replaced = false;
          for (auto& [existing, old] : entries.items) {
            if (existing == key.as_string()) {
              old = std::move(value);
              replaced = true;
              break;
            }
          }
          if (!replaced) entries.items.emplace_back(key.as_string(), std::move(value));
        }
        return Value::dict(std::move(entries));
      }
      case Expr::Kind::kGetattr:
        return get_attr(eval(*e.a), e.name);
      case Expr::Kind::kGetitem: {
        const Value obj = eval(*e.a);
        if (e.b->kind == Expr::Kind::kSlice) {
          const Expr& s = *e.b;
          const std::optional<Value> start = s.a ? std::optional<Value>(eval(*s.a)) : std::nullopt;
          const std::optional<Value> stop = s.b ? std::optional<Value>(eval(*s.b)) : std::nullopt;
          const std::optional<Value> step = s.c ? std::optional<Value>(eval(*s.c)) : std::nullopt;
          if (is_literal(*e.a) && (!s.a || is_literal(*s.a)) && (!s.b || is_literal(*s.b)) &&
              (!s.c || is_literal(*s.c))) {
            // jinja2's optimizer folds a slice of literals at compile time through the sandbox's getitem,
            // where a TypeError makes an Undefined; at run time the same slice is Python's own, which raises.
            try {
              return get_slice(obj, start ? &*start : nullptr, stop ? &*stop : nullptr,
                               step ? &*step : nullptr);
            } catch (const TemplateError&) {
              return Value::undefined("a literal that cannot be sliced");
            }
          }
          return get_slice(obj, start ? &*start : nullptr, stop ? &*stop : nullptr, step ? &*step : nullptr);
        }
        return get_item(obj, eval(*e.b));
      }
      case Expr::Kind::kSlice:
        throw TemplateError("a slice outside a subscript is not supported");
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.a);
        CallArgs args = eval_args(e);
        return call_value(env_, callee, args);
      }
      case Expr::Kind::kFilter:
        return eval_filter(e, nullptr);
      case Expr::Kind::kTest: {
        const Value v = eval(*e.a);
        CallArgs args = eval_args(e);
        return Value::boolean(apply_test(e.slot, env_, v, args));
      }
      case Expr::Kind::kCondExpr:
        if (truthy(eval(*e.a))) return eval(*e.b);
        if (e.c) return eval(*e.c);
        return Value::undefined(fmt::format(
            "the inline if-expression on line {} evaluated to false and no else section was defined.",
            e.line));
      case Expr::Kind::kAnd: {
        Value left = eval(*e.a);
        if (!truthy(left)) return left;
        return eval(*e.b);
      }
      case Expr::Kind::kOr: {
        Value left = eval(*e.a);
        if (truthy(left)) return left;
        return eval(*e.b);
      }
      case Expr::Kind::kNot:
        return Value::boolean(!truthy(eval(*e.a)));
      case Expr::Kind::kNeg:
        return negate(eval(*e.a));
      case Expr::Kind::kPos:
        return unary_plus(eval(*e.a));
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.a);
        const Value b = eval(*e.b);
        return binary(env_, e.bin_op, a, b);
      }
      case Expr::Kind::kConcat: {
        std::string out;
        for (const ExprPtr& item : e.items) {
          append_str(out, eval(*item));
          env_.check_string(out.size());
        }
        env_.step(out.size() / 256);
        return Value::string(std::move(out));
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.a);
        for (const auto& [op, expr] : e.comparisons) {
          Value right = eval(*expr);
          if (!compare_op(op, left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kNsRef:
        throw TemplateError("a namespace reference outside an assignment");
    }
    throw TemplateError("unknown expression");
  }

  // A literal: a constant, or a list, tuple or dict of literals.
  static bool is_literal(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kConst:
        return true;
      case Expr::Kind::kTuple:
      case Expr::Kind::kList:
        return std::all_of(e.items.begin(), e.items.end(), [](const ExprPtr& i) { return is_literal(*i); });
      case Expr::Kind::kDict:
        return std::all_of(e.pairs.begin(), e.pairs.end(),
                           [](const auto& p) { return is_literal(*p.first) && is_literal(*p.second); });
      default:
        return false;
    }
  }

  static bool compare_op(Expr::CmpOp op, const Value& a, const Value& b) {
    switch (op) {
      case Expr::CmpOp::kEq:
        return equals(a, b);
      case Expr::CmpOp::kNe:
        return !equals(a, b);
      case Expr::CmpOp::kLt:
        return compare(a, b, CompareOp::kLt);
      case Expr::CmpOp::kLe:
        return compare(a, b, CompareOp::kLe);
      case Expr::CmpOp::kGt:
        return compare(a, b, CompareOp::kGt);
      case Expr::CmpOp::kGe:
        return compare(a, b, CompareOp::kGe);
      case Expr::CmpOp::kIn:
        return contains(b, a);
      case Expr::CmpOp::kNotIn:
        return !contains(b, a);
    }
    return false;
  }

  const Program& program_;
  std::unordered_map<std::string, Value> variables_;
  Env& env_;
  size_t max_output_bytes_;
  std::vector<Value> slots_;
  std::vector<bool> present_;
  std::string* out_ = nullptr;
};

std::string with_line(const TemplateError& e) {
  return e.line > 0 ? fmt::format("line {}: {}", e.line, e.what()) : std::string(e.what());
}

}  // namespace

Result<Template> Template::parse(std::string_view source, const ParseOptions& options) {
  if (source.size() > options.max_source_bytes) {
    return Status::invalid_argument(fmt::format("the template is {} bytes, over the limit of {}",
                                                source.size(), options.max_source_bytes));
  }
  try {
    LexerOptions lexer_options{options.trim_blocks, options.lstrip_blocks};
    ParserLimits limits{options.max_depth, options.max_expr_depth};
    std::shared_ptr<const Program> program = parse_program(source, lexer_options, limits);
    return Template(std::move(program));
  } catch (const TemplateError& e) {
    return Status::invalid_argument(with_line(e));
  }
}

template <typename Json>
Result<std::string> Template::render_json(const Json& variables, const RenderLimits& limits) const {
  if (!variables.is_object()) return Status::invalid_argument("template variables must be a JSON object");
  Env env{limits.max_output_bytes, limits.max_items, limits.max_steps, 0, {}};
  // Whatever way the render ends, its namespaces are emptied (Env's comment says why).
  struct EmptyNamespaces {
    Env& env;
    ~EmptyNamespaces() {
      for (const auto& ns : env.namespaces) ns->attrs.clear();
    }
  } empty_namespaces{env};
  try {
    std::unordered_map<std::string, Value> vars;
    for (auto it = variables.begin(); it != variables.end(); ++it) vars[it.key()] = from_json(it.value());
    Renderer renderer(*program_, std::move(vars), env, limits.max_output_bytes);
    return renderer.run();
  } catch (const TemplateError& e) {
    return Status::invalid_argument(with_line(e));
  } catch (const std::exception& e) {
    return Status::invalid_argument(fmt::format("rendering failed: {}", e.what()));
  }
}

Result<std::string> Template::render(const nlohmann::ordered_json& variables,
                                     const RenderLimits& limits) const {
  return render_json(variables, limits);
}

Result<std::string> Template::render(const nlohmann::json& variables, const RenderLimits& limits) const {
  return render_json(variables, limits);
}

}  // namespace crescent::jinja
