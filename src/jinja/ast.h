// The syntax tree of a template (internal to the jinja component): jinja2's nodes.py for the supported
// subset, plus what the scope analysis (scope.h) writes into it: the variable slot of every name and the
// load instructions of every frame.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace crescent::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// How a frame's variable is set when the frame is entered (jinja2's idtracking load instructions).
struct LoadInstr {
  enum class Kind { kParam, kResolve, kAlias, kUndefined };
  Kind kind = Kind::kUndefined;
  int slot = -1;        // the variable set
  std::string name;     // kResolve: the context name read
  int alias_slot = -1;  // kAlias: the enclosing frame's variable copied
};

/// The load instructions of one frame, run in order on entry.
struct Frame {
  std::vector<LoadInstr> loads;
};

struct Expr {
  enum class Kind {
    kConst,
    kName,
    kNsRef,
    kTuple,
    kList,
    kDict,
    kGetattr,
    kGetitem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kCondExpr,
    kAnd,
    kOr,
    kNot,
    kNeg,
    kPos,
    kBinary,
    kConcat,
    kCompare,
  };
  enum class Ctx { kLoad, kStore, kParam };
  enum class BinOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
  enum class CmpOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

  Expr(Kind kind, int line) : kind(kind), line(line) {}

  Kind kind;
  int line;
  int depth = 1;               // of the tree under this node (the parser bounds it)
  Ctx ctx = Ctx::kLoad;        // kName, kTuple
  Value value;                 // kConst
  std::string name;            // kName, kNsRef, kGetattr (the attribute), kFilter, kTest
  std::string attr;            // kNsRef
  int slot = -1;               // kName, kNsRef: set by the scope analysis
  BinOp bin_op = BinOp::kAdd;  // kBinary
  ExprPtr a, b, c;             // operands: object / left / test / start; right / arg / stop; step / else
  std::vector<ExprPtr> items;  // kTuple, kList, kConcat, kCall/kFilter/kTest positional arguments
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;         // kDict
  std::vector<std::pair<std::string, ExprPtr>> keywords;  // kCall, kFilter, kTest
  std::vector<std::pair<CmpOp, ExprPtr>> comparisons;     // kCompare (a is the first operand)
};

struct Stmt {
  enum class Kind { kOutput, kFor, kIf, kAssign, kAssignBlock, kWith, kBreak, kContinue, kScope };

  Stmt(Kind kind, int line) : kind(kind), line(line) {}

  Kind kind;
  int line;
  std::vector<ExprPtr> outputs;  // kOutput: data (string constants) and expressions, in order
  ExprPtr target;                // kFor, kAssign, kAssignBlock
  ExprPtr expr;       // kFor: the iterable; kIf: the test; kAssign: the value; kAssignBlock: filter
  ExprPtr loop_test;  // kFor: `if` filter of the items
  Body body;          // kFor, kIf, kAssignBlock, kWith, kScope
  Body else_body;     // kFor, kIf
  std::vector<std::pair<ExprPtr, Body>> elifs;  // kIf
  std::vector<ExprPtr> with_targets;            // kWith
  std::vector<ExprPtr> with_values;             // kWith
  // Frames (scope analysis): kFor body, else, test; kAssignBlock, kWith, kScope body.
  Frame frame;
  Frame else_frame;
  Frame test_frame;
  int loop_slot = -1;  // kFor: the `loop` variable of the body
};

/// A parsed template.
struct Program {
  Body body;
  Frame root_frame;
  int slot_count = 0;
};

}  // namespace crescent::jinja
