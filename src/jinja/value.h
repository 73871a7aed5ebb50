// The values a template computes with, and Python's rules for them (internal to the jinja component).
// jinja2 evaluates templates as Python code, so a value behaves as the Python object it stands for: an int
// (64-bit here; past that an error, where Python would grow), a float, a str (UTF-8 bytes here, indexed by
// code point), a list, a tuple, a dict (insertion-ordered), None, jinja2's Undefined, a namespace(), a
// loop object, a callable (a global or a bound method), and the one-shot iterators and dict views that
// some filters and methods return. What Python would do differently from anything written here is an error
// (a TemplateError naming it), never another result.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace crescent::jinja {

/// A template error at render or parse time; Template turns it into a Status. `line` 0: not known here (the
/// renderer adds the line of the node it was evaluating).
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& message, int line = 0)
      : std::runtime_error(message), line(line) {}
  int line;
};

class Value;
using ValueList = std::vector<Value>;

/// The deepest nesting of containers a value may have (JSON input is held to 512).
inline constexpr int kMaxValueDepth = 1000;

/// A dict's entries in insertion order (Python's dict order); keys are strings (JSON's).
struct DictEntries {
  std::vector<std::pair<std::string, Value>> items;
  /// The value at `key`, nullptr when absent.
  const Value* find(std::string_view key) const;
};

/// namespace(...): the one mutable object of a template (`{% set ns.attr = ... %}`).
struct NamespaceState {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(std::string_view name);
};

/// A for loop's `loop` object (jinja2's LoopContext): shared by every iteration, as in jinja2.
struct LoopState {
  std::shared_ptr<const ValueList> items;
  int64_t index0 = 0;
  std::shared_ptr<Value> last_changed;  // loop.changed()'s memory; null before its first call
};

/// Positional and keyword arguments of a call.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

/// A global function or a bound method.
struct Callable {
  std::string name;  // for messages: "raise_exception", "str.startswith"
  std::function<Value(CallArgs&)> call;
};

/// A one-shot iterator (what reverse, map, select, ... return in jinja2): iterating it twice is an error
/// here, since Python would find it exhausted (or half-consumed).
struct IteratorState {
  ValueList items;
  bool used = false;
};

/// Flavours of a sequence value: list, tuple, a dict view (dict.items()/keys()/values(): iterates and has a
/// length, no index), or a range() (indexes like a tuple). Views and ranges have no printed form, JSON form
/// or equality here (Python prints "range(0, 3)", "dict_items([...])").
enum class SeqKind : uint8_t { kList, kTuple, kView, kRange };

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kSeq,
    kDict,
    kNamespace,
    kLoop,
    kCallable,
    kIterator,
  };

  /// Undefined (jinja2's default Undefined); `hint` is the message of the error its misuse raises.
  Value() : kind_(Kind::kUndefined) {}
  static Value undefined(std::string hint);
  static Value none() { return Value(Kind::kNone); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  static Value string(std::shared_ptr<const std::string> s);
  static Value list(ValueList items, SeqKind kind = SeqKind::kList);
  static Value dict(DictEntries entries);
  static Value namespace_object(std::shared_ptr<NamespaceState> state);
  static Value loop(std::shared_ptr<LoopState> state);
  /// `holds_depth`: the depth of what the function holds (a bound method's object), which it adds 1 to.
  static Value callable(std::string name, std::function<Value(CallArgs&)> call, int holds_depth = -1);
  static Value iterator(ValueList items);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  /// int or bool (Python's bool is an int).
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_integral() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_seq() const { return kind_ == Kind::kSeq; }
  bool is_list() const { return kind_ == Kind::kSeq && seq_kind_ == SeqKind::kList; }
  bool is_tuple() const { return kind_ == Kind::kSeq && seq_kind_ == SeqKind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  SeqKind seq_kind() const { return seq_kind_; }

  /// REQUIRES: the matching kind.
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }  // int or bool
  double as_float() const { return f_; }
  double as_number() const { return is_float() ? f_ : static_cast<double>(i_); }
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(ptr_); }
  const std::shared_ptr<const std::string>& string_ptr() const {
    return std::get<std::shared_ptr<const std::string>>(ptr_);
  }
  const ValueList& as_seq() const { return *std::get<std::shared_ptr<const ValueList>>(ptr_); }
  const std::shared_ptr<const ValueList>& seq_ptr() const {
    return std::get<std::shared_ptr<const ValueList>>(ptr_);
  }
  const DictEntries& as_dict() const { return *std::get<std::shared_ptr<const DictEntries>>(ptr_); }
  NamespaceState& as_namespace() const { return *std::get<std::shared_ptr<NamespaceState>>(ptr_); }
  LoopState& as_loop() const { return *std::get<std::shared_ptr<LoopState>>(ptr_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(ptr_); }
  IteratorState& as_iterator() const { return *std::get<std::shared_ptr<IteratorState>>(ptr_); }
  /// The undefined value's error message ("'x' is undefined").
  std::string undefined_hint() const;

  /// How deeply containers nest in this value: 0 for a scalar, 1 + the deepest item for a list, tuple, dict
  /// or iterator, 1 + its object's for a bound method (namespaces and loops count 0: they hold references,
  /// and the render empties its namespaces at its end). Building a value deeper than kMaxValueDepth throws,
  /// so that printing, comparing, serialising and destroying it cannot recurse without bound.
  int depth() const { return depth_; }

  /// Python's type name ("str", "int", "dict", "NoneType", ...), for messages.
  std::string type_name() const;
  /// The same object (Python's `is`) for shared objects; for others, equal kind and value.
  bool same_object(const Value& other) const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_;
  SeqKind seq_kind_ = SeqKind::kList;
  uint16_t depth_ = 0;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::variant<std::monostate, std::shared_ptr<const std::string>, std::shared_ptr<const ValueList>,
               std::shared_ptr<const DictEntries>, std::shared_ptr<NamespaceState>,
               std::shared_ptr<LoopState>, std::shared_ptr<const Callable>, std::shared_ptr<IteratorState>>
      ptr_;
};

/// Python's bool(value): empty strings and containers, 0, None and Undefined are false; an iterator is
/// always true (a generator's truth in Python).
bool truthy(const Value& v);

/// str(value) as jinja2 prints it: "" for Undefined, "None", "True", 3, 1.5 (Python's float repr), a
/// string as itself, a list/tuple/dict as Python's repr. Errors for values whose printed form is an object
/// address in Python (loop, namespace, callables, iterators, views).
std::string to_str(const Value& v);
/// Appends to_str(v) to `out`.
void append_str(std::string& out, const Value& v);
/// Python's repr(value). Strings: supported when ASCII (Python's escaping of other characters depends on its
/// Unicode database: an error here).
std::string to_repr(const Value& v);

/// Python's ==.
bool equals(const Value& a, const Value& b);
/// Python's <, <=, >, >= for numbers, strings, and lists/tuples of those; other pairs are a TypeError, an
/// Undefined operand an UndefinedError (both thrown as TemplateError).
enum class CompareOp { kLt, kLe, kGt, kGe };
bool compare(const Value& a, const Value& b, CompareOp op);

/// Python's float repr: shortest round trip, "1.0", "1e+16", "1e-05", "inf", "nan".
std::string python_float_repr(double f);

/// json.dumps(value, ensure_ascii, indent, separators, sort_keys) as Hugging Face's tojson filter calls it.
/// Without `has_indent` everything is on one line; without `has_separators`, json's defaults (", " or ","
/// with an indent, and ": ").
struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // one level's indent (an int indent n is n spaces)
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};
std::string python_json_dumps(const Value& v, const JsonDumpOptions& options);

/// A JSON value as the Python object json.loads gives (objects keep their key order when `ordered_json`).
/// Errors: an unsigned integer above INT64_MAX, a string that is not UTF-8.
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

}  // namespace crescent::jinja
