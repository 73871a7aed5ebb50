// What a template can do to values (internal to the jinja component): jinja2's filters, tests and globals as
// Hugging Face's environment has them, the Python methods templates call (str.startswith, dict.items, ...),
// and the object protocol jinja2's ImmutableSandboxedEnvironment applies (attribute and item lookup with
// their fallbacks, calls, iteration, `in`, arithmetic). Each is one entry of a table, looked up by name at
// parse time; a name jinja2 knows and crescent does not implement is refused by name (never run
// differently).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace crescent::jinja {

/// Bounds of one render, and its step count (Template's RenderLimits).
struct Env {
  size_t max_string_bytes = 0;  // largest string a template may build (the output cap)
  size_t max_items = 0;         // largest list a template may build
  uint64_t max_steps = 0;       // statements, loop iterations and items processed
  uint64_t steps = 0;
  /// Every namespace() of the render: emptied when it ends, which breaks the reference cycles a template can
  /// make through them (ns.self = ns) and unlinks chains of them without recursion.
  std::vector<std::shared_ptr<NamespaceState>> namespaces;

  /// Counts `n` steps; throws TemplateError past max_steps.
  void step(uint64_t n = 1);
  /// Throws TemplateError when a string of `bytes` would exceed max_string_bytes.
  void check_string(size_t bytes) const;
  /// Throws TemplateError when a list of `n` items would exceed max_items.
  void check_items(size_t n) const;
};

/// The filter named `name` (an index for apply_filter), or -1 when crescent has none; `jinja2_has` tells
/// whether jinja2 (with Hugging Face's tojson) has one by that name, for the error message.
int find_filter(std::string_view name, bool& jinja2_has);
/// Applies filter `index` to `value` with `args`. Throws TemplateError as jinja2 would raise.
Value apply_filter(int index, Env& env, const Value& value, CallArgs& args);

/// The test named `name` (an index for apply_test), or -1 (as find_filter).
int find_test(std::string_view name, bool& jinja2_has);
bool apply_test(int index, Env& env, const Value& value, CallArgs& args);

/// A global of Hugging Face's environment (range, namespace, dict, raise_exception, strftime_now, and
/// jinja2's lipsum, cycler, joiner, which fail when called); `found` false when there is none. REQUIRES:
/// `env` outlives the value (namespace() registers what it makes there).
Value find_global(std::string_view name, bool& found, Env& env);

/// `obj.name` in the sandbox: a Python attribute (a bound method) first, then obj[name]; an Undefined when
/// neither exists. Throws for an Undefined `obj`, and for Python attributes crescent does not implement.
Value get_attr(const Value& obj, const std::string& name);
/// `obj[key]`: the item first, then (for a string key) the attribute; an Undefined when neither exists.
Value get_item(const Value& obj, const Value& key);
/// `obj[start:stop:step]` (each may be absent or None). Throws when `obj` cannot be sliced or a bound is not
/// an integer (jinja2 compiles slices to Python's own, outside the sandbox's getitem).
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
/// `callee(args)`.
Value call_value(Env& env, const Value& callee, CallArgs& args);
/// The items `for x in value` visits (a dict's keys, a string's characters; none for Undefined). Throws for
/// a value Python cannot iterate, and for an iterator iterated before.
ValueList iterate(const Value& value);
/// len(value) (0 for Undefined).
int64_t length(const Value& value);
/// `item in container`.
bool contains(const Value& container, const Value& item);
/// `a op b` for + - * / // % **.
Value binary(Env& env, Expr::BinOp op, const Value& a, const Value& b);
/// -v, +v.
Value negate(const Value& v);
Value unary_plus(const Value& v);

}  // namespace crescent::jinja
