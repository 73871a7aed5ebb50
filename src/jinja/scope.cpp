#include "jinja/scope.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

namespace crescent::jinja {
namespace {

// jinja2's idtracking.Symbols. An identifier is "l_<level>_<name>", as in jinja2's generated code, where
// every frame's variables are locals of one Python function.
struct Symbols {
  struct Load {
    LoadInstr::Kind kind;
    std::string param;  // kResolve: the name; kAlias: the identifier copied
  };

  Symbols* parent = nullptr;
  int level = 0;
  std::map<std::string, std::string> refs;  // name -> identifier
  std::map<std::string, Load> loads;        // identifier -> how it is set on entry
  std::set<std::string> stores;

  explicit Symbols(Symbols* parent) : parent(parent), level(parent ? parent->level + 1 : 0) {}

  std::string define_ref(const std::string& name, const Load& load) {
    std::string ident = fmt::format("l_{}_{}", level, name);
    refs[name] = ident;
    loads[ident] = load;
    return ident;
  }

  const std::string* find_ref(const std::string& name) const {
    if (auto it = refs.find(name); it != refs.end()) return &it->second;
    return parent ? parent->find_ref(name) : nullptr;
  }

  void store(const std::string& name) {
    stores.insert(name);
    if (refs.count(name) != 0) return;
    if (parent != nullptr) {
      if (const std::string* outer = parent->find_ref(name)) {
        define_ref(name, {LoadInstr::Kind::kAlias, *outer});
        return;
      }
    }
    define_ref(name, {LoadInstr::Kind::kUndefined, {}});
  }

  std::string declare_parameter(const std::string& name) {
    stores.insert(name);
    return define_ref(name, {LoadInstr::Kind::kParam, {}});
  }

  void load(const std::string& name) {
    if (find_ref(name) == nullptr) define_ref(name, {LoadInstr::Kind::kResolve, name});
  }

  void branch_update(const std::vector<Symbols>& branches) {
    std::map<std::string, size_t> branch_stores;
    for (const Symbols& branch : branches) {
      for (const std::string& target : branch.stores) {
        if (stores.count(target) == 0) ++branch_stores[target];
      }
    }
    for (const Symbols& branch : branches) {
      for (const auto& [k, v] : branch.refs) refs[k] = v;
      for (const auto& [k, v] : branch.loads) loads[k] = v;
      stores.insert(branch.stores.begin(), branch.stores.end());
    }
    for (const auto& [name, count] : branch_stores) {
      if (count == branches.size()) continue;
      const std::string target = *find_ref(name);
      if (parent != nullptr) {
        if (const std::string* outer = parent->find_ref(name)) {
          loads[target] = {LoadInstr::Kind::kAlias, *outer};
          continue;
        }
      }
      loads[target] = {LoadInstr::Kind::kResolve, name};
    }
  }
};

class Analyzer {
 public:
  explicit Analyzer(Program& program) : program_(program) {}

  void run() {
    Symbols root(nullptr);
    for (const StmtPtr& s : program_.body) frame_visit(*s, root);
    program_.root_frame = frame_of(root);
    compile_body(program_.body, root);
    program_.slot_count = static_cast<int>(slots_.size());
  }

 private:
  int slot_of(const std::string& ident) {
    auto [it, inserted] = slots_.emplace(ident, static_cast<int>(slots_.size()));
    return it->second;
  }

  Frame frame_of(const Symbols& symbols) {
    Frame frame;
    for (const auto& [ident, load] : symbols.loads) {
      LoadInstr instr;
      instr.kind = load.kind;
      instr.slot = slot_of(ident);
      if (load.kind == LoadInstr::Kind::kResolve) instr.name = load.param;
      if (load.kind == LoadInstr::Kind::kAlias) instr.alias_slot = slot_of(load.param);
      frame.loads.push_back(std::move(instr));
    }
    return frame;
  }

  // ---- FrameSymbolVisitor ----

  void expr_visit(const Expr& e, Symbols& s, bool store_as_param = false) {
    switch (e.kind) {
      case Expr::Kind::kName:
        if (store_as_param || e.ctx == Expr::Ctx::kParam) {
          s.declare_parameter(e.name);
        } else if (e.ctx == Expr::Ctx::kStore) {
          s.store(e.name);
        } else {
          s.load(e.name);
        }
        return;
      case Expr::Kind::kNsRef:
        s.load(e.name);
        return;
      default:
        break;
    }
    // Children in jinja2's field order (CondExpr: test, then the two branches).
    if (e.a) expr_visit(*e.a, s, store_as_param);
    if (e.b) expr_visit(*e.b, s, store_as_param);
    if (e.c) expr_visit(*e.c, s, store_as_param);
    for (const auto& i : e.items) expr_visit(*i, s, store_as_param);
    for (const auto& [k, v] : e.pairs) {
      expr_visit(*k, s, store_as_param);
      expr_visit(*v, s, store_as_param);
    }
    for (const auto& [k, v] : e.keywords) expr_visit(*v, s, store_as_param);
    for (const auto& [op, v] : e.comparisons) expr_visit(*v, s, store_as_param);
  }

  void if_visit(const Expr& test, const Body& body, const std::vector<std::pair<ExprPtr, Body>>* elifs,
                size_t elif_from, const Body* else_body, Symbols& s) {
    expr_visit(test, s);
    std::vector<Symbols> branches;
    branches.push_back(s);
    for (const StmtPtr& stmt : body) frame_visit(*stmt, branches.back());
    // jinja2 keeps elifs as a list of If nodes, each visited (with its own branches) in one copy.
    branches.push_back(s);
    if (elifs != nullptr) {
      for (size_t i = elif_from; i < elifs->size(); ++i) {
        if_visit(*(*elifs)[i].first, (*elifs)[i].second, nullptr, 0, nullptr, branches.back());
      }
    }
    branches.push_back(s);
    if (else_body != nullptr) {
      for (const StmtPtr& stmt : *else_body) frame_visit(*stmt, branches.back());
    }
    s.branch_update(branches);
  }

  void frame_visit(const Stmt& st, Symbols& s) {
    switch (st.kind) {
      case Stmt::Kind::kOutput:
        for (const auto& e : st.outputs) expr_visit(*e, s);
        return;
      case Stmt::Kind::kIf:
        if_visit(*st.expr, st.body, &st.elifs, 0, &st.else_body, s);
        return;
      case Stmt::Kind::kAssign:
        expr_visit(*st.expr, s);
        expr_visit(*st.target, s);
        return;
      case Stmt::Kind::kFor:
        expr_visit(*st.expr, s);
        return;
      case Stmt::Kind::kAssignBlock:
        expr_visit(*st.target, s);
        return;
      case Stmt::Kind::kWith:
        for (const auto& v : st.with_values) expr_visit(*v, s);
        return;
      case Stmt::Kind::kScope:
      case Stmt::Kind::kBreak:
      case Stmt::Kind::kContinue:
        return;
    }
  }

  // ---- The code generator's frames ----

  void resolve_names(Expr& e, const Symbols& s) {
    if (e.kind == Expr::Kind::kName || e.kind == Expr::Kind::kNsRef) {
      const std::string* ident = s.find_ref(e.name);
      if (ident == nullptr) {
        throw TemplateError(
            fmt::format("the name '{}' cannot be resolved here (jinja2 fails to compile it)", e.name),
            e.line);
      }
      e.slot = slot_of(*ident);
      return;
    }
    if (e.a) resolve_names(*e.a, s);
    if (e.b) resolve_names(*e.b, s);
    if (e.c) resolve_names(*e.c, s);
    for (auto& i : e.items) resolve_names(*i, s);
    for (auto& [k, v] : e.pairs) {
      resolve_names(*k, s);
      resolve_names(*v, s);
    }
    for (auto& [k, v] : e.keywords) resolve_names(*v, s);
    for (auto& [op, v] : e.comparisons) resolve_names(*v, s);
  }

  void compile_body(Body& body, Symbols& s) {
    for (StmtPtr& stmt : body) compile_stmt(*stmt, s);
  }

  static void collect_loop_stores(const Expr& e, int line) {
    if (e.kind == Expr::Kind::kName && e.ctx != Expr::Ctx::kLoad && e.name == "loop") {
      throw TemplateError("Can't assign to special loop variable in for-loop target", line);
    }
    for (const auto& i : e.items) collect_loop_stores(*i, line);
  }

  static void check_no_loop_assignment(const Body& body) {
    for (const StmtPtr& st : body) {
      if (st->target) collect_loop_stores(*st->target, st->line);
      for (const auto& t : st->with_targets) collect_loop_stores(*t, st->line);
      check_no_loop_assignment(st->body);
      check_no_loop_assignment(st->else_body);
      for (const auto& [test, b] : st->elifs) check_no_loop_assignment(b);
    }
  }

  static void names_loaded(const Expr& e, std::set<std::string>& out) {
    if (e.kind == Expr::Kind::kName) out.insert(e.name);
    for (const ExprPtr* c : {&e.a, &e.b, &e.c}) {
      if (*c) names_loaded(**c, out);
    }
    for (const auto& i : e.items) names_loaded(*i, out);
    for (const auto& [k, v] : e.pairs) {
      names_loaded(*k, out);
      names_loaded(*v, out);
    }
    for (const auto& [k, v] : e.keywords) names_loaded(*v, out);
    for (const auto& [op, v] : e.comparisons) names_loaded(*v, out);
  }

  static void namespaces_assigned(const Body& body, std::set<std::string>& out) {
    for (const StmtPtr& st : body) {
      if (st->target && st->target->kind == Expr::Kind::kNsRef) out.insert(st->target->name);
      namespaces_assigned(st->body, out);
      namespaces_assigned(st->else_body, out);
      for (const auto& [test, b] : st->elifs) namespaces_assigned(b, out);
    }
  }

  void compile_stmt(Stmt& st, Symbols& s) {
    switch (st.kind) {
      case Stmt::Kind::kOutput:
        for (auto& e : st.outputs) resolve_names(*e, s);
        return;
      case Stmt::Kind::kIf:
        // A soft frame: the same symbols.
        resolve_names(*st.expr, s);
        compile_body(st.body, s);
        for (auto& [test, body] : st.elifs) {
          resolve_names(*test, s);
          compile_body(body, s);
        }
        compile_body(st.else_body, s);
        return;
      case Stmt::Kind::kAssign:
        resolve_names(*st.target, s);
        resolve_names(*st.expr, s);
        return;
      case Stmt::Kind::kFor: {
        collect_loop_stores(*st.target, st.line);
        check_no_loop_assignment(st.body);
        check_no_loop_assignment(st.else_body);
        Symbols loop(&s);
        st.loop_slot = slot_of(loop.declare_parameter("loop"));
        expr_visit(*st.target, loop, /*store_as_param=*/true);
        for (const StmtPtr& child : st.body) frame_visit(*child, loop);
        Symbols else_symbols(&s);
        for (const StmtPtr& child : st.else_body) frame_visit(*child, else_symbols);
        if (st.loop_test) {
          Symbols test(&s);
          expr_visit(*st.target, test, /*store_as_param=*/true);
          expr_visit(*st.loop_test, test);
          st.test_frame = frame_of(test);
          resolve_names(*st.loop_test, test);
          std::set<std::string> read, assigned;
          names_loaded(*st.loop_test, read);
          namespaces_assigned(st.body, assigned);
          for (const std::string& name : read) {
            if (assigned.count(name) != 0) {
              throw TemplateError(
                  fmt::format("a loop filter (for ... if) reading the namespace '{}' that the loop "
                              "body assigns to is not supported",
                              name),
                  st.line);
            }
          }
        }
        resolve_names(*st.expr, s);
        st.frame = frame_of(loop);
        resolve_names(*st.target, loop);
        compile_body(st.body, loop);
        st.else_frame = frame_of(else_symbols);
        compile_body(st.else_body, else_symbols);
        return;
      }
      case Stmt::Kind::kAssignBlock: {
        Symbols block(&s);
        for (const StmtPtr& child : st.body) frame_visit(*child, block);
        st.frame = frame_of(block);
        compile_body(st.body, block);
        resolve_names(*st.target, s);
        if (st.expr) resolve_names(*st.expr, block);
        return;
      }
      case Stmt::Kind::kWith: {
        Symbols with(&s);
        for (const auto& t : st.with_targets) expr_visit(*t, with);
        for (const StmtPtr& child : st.body) frame_visit(*child, with);
        st.frame = frame_of(with);
        for (auto& t : st.with_targets) resolve_names(*t, with);
        for (auto& v : st.with_values) resolve_names(*v, s);
        compile_body(st.body, with);
        return;
      }
      case Stmt::Kind::kScope: {
        Symbols inner(&s);
        for (const StmtPtr& child : st.body) frame_visit(*child, inner);
        st.frame = frame_of(inner);
        compile_body(st.body, inner);
        return;
      }
      case Stmt::Kind::kBreak:
      case Stmt::Kind::kContinue:
        return;
    }
  }

  Program& program_;
  std::map<std::string, int> slots_;
};

}  // namespace

void analyze_scopes(Program& program) {
  Analyzer(program).run();
}

}  // namespace crescent::jinja
