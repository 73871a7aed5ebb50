#include "jinja/builtins.h"

#include <fmt/format.h>
#include <sys/time.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>

#include "jinja/text.h"

namespace crescent::jinja {

void Env::step(uint64_t n) {
  steps += n;
  if (steps > max_steps) {
    throw TemplateError(
        fmt::format("the template ran more than {} steps (a loop that does not end?)", max_steps));
  }
}

void Env::check_string(size_t bytes) const {
  if (bytes > max_string_bytes) {
    throw TemplateError(
        fmt::format("a string of {} bytes is over the limit of {} bytes", bytes, max_string_bytes));
  }
}

void Env::check_items(size_t n) const {
  if (n > max_items)
    throw TemplateError(fmt::format("a list of {} items is over the limit of {}", n, max_items));
}

namespace {

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(message);
}

[[noreturn]] void undefined_error(const Value& v) {
  throw TemplateError(v.undefined_hint());
}

std::string object_name(const Value& v) {
  if (v.is_undefined()) return "Undefined";
  return fmt::format("{} object", v.type_name());
}

// ---- Argument binding (Python's rules for a def with defaults) ----

class Params {
 public:
  Params(std::string_view func, CallArgs& args, std::initializer_list<std::string_view> names,
         size_t required = 0)
      : values_(names.size()) {
    const std::vector<std::string_view> n(names);
    if (args.positional.size() > n.size()) {
      type_error(
          fmt::format("{}() takes at most {} arguments ({} given)", func, n.size(), args.positional.size()));
    }
    for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = &args.positional[i];
    for (auto& [key, value] : args.keywords) {
      const auto it = std::find(n.begin(), n.end(), key);
      if (it == n.end()) type_error(fmt::format("{}() got an unexpected keyword argument '{}'", func, key));
      const auto i = static_cast<size_t>(it - n.begin());
      if (values_[i] != nullptr)
        type_error(fmt::format("{}() got multiple values for argument '{}'", func, key));
      values_[i] = &value;
    }
    for (size_t i = 0; i < required; ++i) {
      if (values_[i] == nullptr) type_error(fmt::format("{}() missing required argument '{}'", func, n[i]));
    }
  }

  /// The argument, nullptr when not given.
  const Value* get(size_t i) const { return values_[i]; }

 private:
  std::vector<const Value*> values_;
};

void no_keywords(std::string_view func, const CallArgs& args) {
  if (!args.keywords.empty()) type_error(fmt::format("{}() takes no keyword arguments", func));
}

void positional_count(std::string_view func, const CallArgs& args, size_t min, size_t max) {
  no_keywords(func, args);
  if (args.positional.size() < min || args.positional.size() > max) {
    type_error(
        fmt::format("{}() takes {} to {} arguments ({} given)", func, min, max, args.positional.size()));
  }
}

int64_t int_arg(std::string_view func, const Value& v) {
  if (!v.is_integral())
    type_error(fmt::format("{}(): '{}' object cannot be interpreted as an integer", func, v.type_name()));
  return v.as_int();
}

const std::string& str_arg(std::string_view func, const Value& v) {
  if (!v.is_string()) type_error(fmt::format("{}(): expected a str, got '{}'", func, v.type_name()));
  return v.as_string();
}

std::optional<std::string> optional_str_arg(std::string_view func, const Value* v) {
  if (v == nullptr || v->is_none()) return std::nullopt;
  return str_arg(func, *v);
}

// soft_str: what jinja2's string filters apply to their input (str(), "" for Undefined).
std::string soft_str(const Value& v) {
  return to_str(v);
}

// ---- Python integer arithmetic with overflow checks ----

int64_t checked(bool overflow, int64_t value) {
  if (overflow) throw TemplateError("integer overflow (templates compute in 64-bit integers)");
  return value;
}

int64_t add_checked(int64_t a, int64_t b) {
  int64_t r;
  const bool overflow = __builtin_add_overflow(a, b, &r);
  return checked(overflow, r);
}

int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r;
  const bool overflow = __builtin_sub_overflow(a, b, &r);
  return checked(overflow, r);
}

int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r;
  const bool overflow = __builtin_mul_overflow(a, b, &r);
  return checked(overflow, r);
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw TemplateError("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1) checked(true, 0);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == 0) throw TemplateError("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// CPython's float_divmod.
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  if (wx == 0.0) throw TemplateError("float divmod() / floor division / modulo by zero");
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) throw TemplateError("0.0 cannot be raised to a negative power");
    return Value::floating(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  int64_t result = 1;
  int64_t b = base;
  int64_t e = exp;
  while (e > 0) {
    if (e & 1) result = mul_checked(result, b);
    e >>= 1;
    if (e > 0) b = mul_checked(b, b);
  }
  return Value::integer(result);
}

Value float_pow(double x, double y) {
  if (x == 0.0 && y < 0.0) throw TemplateError("0.0 cannot be raised to a negative power");
  if (x < 0.0 && std::isfinite(x) && std::isfinite(y) && y != std::floor(y)) {
    throw TemplateError("a negative number to a fractional power is a complex number (not supported)");
  }
  const double r = std::pow(x, y);
  if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
    throw TemplateError("(34, 'Numerical result out of range')");
  return Value::floating(r);
}

Value repeat(Env& env, const Value& seq, int64_t times) {
  if (seq.is_string()) {
    if (times <= 0) return Value::string("");
    const std::string& s = seq.as_string();
    if (!s.empty())
      env.check_string(s.size() * std::min<uint64_t>(static_cast<uint64_t>(times), SIZE_MAX / s.size()));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    env.step(out.size() / 256);
    return Value::string(std::move(out));
  }
  if (times <= 0) return Value::list({}, seq.seq_kind());
  const ValueList& items = seq.as_seq();
  if (!items.empty())
    env.check_items(items.size() * std::min<uint64_t>(static_cast<uint64_t>(times), SIZE_MAX / items.size()));
  ValueList out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  env.step(out.size());
  return Value::list(std::move(out), seq.seq_kind());
}

bool repeatable(const Value& v) {
  return v.is_string() || v.is_list() || v.is_tuple();
}

[[noreturn]] void unsupported_operands(const char* op, const Value& a, const Value& b) {
  type_error(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

}  // namespace

Value binary(Env& env, Expr::BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  using Op = Expr::BinOp;
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case Op::kAdd:
      if (ints) return Value::integer(add_checked(a.as_int(), b.as_int()));
      if (nums) return Value::floating(a.as_number() + b.as_number());
      if (a.is_string() && b.is_string()) {
        env.check_string(a.as_string().size() + b.as_string().size());
        env.step((a.as_string().size() + b.as_string().size()) / 256);
        return Value::string(a.as_string() + b.as_string());
      }
      if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
        env.check_items(a.as_seq().size() + b.as_seq().size());
        ValueList out = a.as_seq();
        out.insert(out.end(), b.as_seq().begin(), b.as_seq().end());
        env.step(out.size());
        return Value::list(std::move(out), a.seq_kind());
      }
      if (a.is_string() || b.is_string()) {
        type_error(
            fmt::format("can only concatenate str (not \"{}\") to str", (a.is_string() ? b : a).type_name()));
      }
      unsupported_operands("+", a, b);
    case Op::kSub:
      if (ints) return Value::integer(sub_checked(a.as_int(), b.as_int()));
      if (nums) return Value::floating(a.as_number() - b.as_number());
      unsupported_operands("-", a, b);
    case Op::kMul:
      if (ints) return Value::integer(mul_checked(a.as_int(), b.as_int()));
      if (nums) return Value::floating(a.as_number() * b.as_number());
      if (repeatable(a) && b.is_integral()) return repeat(env, a, b.as_int());
      if (a.is_integral() && repeatable(b)) return repeat(env, b, a.as_int());
      unsupported_operands("*", a, b);
    case Op::kDiv:
      if (nums) {
        if (b.as_number() == 0.0) throw TemplateError(ints ? "division by zero" : "float division by zero");
        if (ints) return Value::floating(static_cast<double>(a.as_int()) / static_cast<double>(b.as_int()));
        return Value::floating(a.as_number() / b.as_number());
      }
      unsupported_operands("/", a, b);
    case Op::kFloorDiv:
      if (ints) return Value::integer(floor_div(a.as_int(), b.as_int()));
      if (nums) {
        double q, m;
        float_divmod(a.as_number(), b.as_number(), q, m);
        return Value::floating(q);
      }
      unsupported_operands("//", a, b);
    case Op::kMod:
      if (ints) return Value::integer(floor_mod(a.as_int(), b.as_int()));
      if (nums) {
        double q, m;
        float_divmod(a.as_number(), b.as_number(), q, m);
        return Value::floating(m);
      }
      if (a.is_string())
        throw TemplateError("printf-style string formatting ('%' on a string) is not supported");
      unsupported_operands("%", a, b);
    case Op::kPow:
      if (ints) return int_pow(a.as_int(), b.as_int());
      if (nums) return float_pow(a.as_number(), b.as_number());
      unsupported_operands("** or pow()", a, b);
  }
  unsupported_operands("?", a, b);
}

Value negate(const Value& v) {
  if (v.is_undefined()) undefined_error(v);
  if (v.is_integral()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) checked(true, 0);
    return Value::integer(-v.as_int());
  }
  if (v.is_float()) return Value::floating(-v.as_float());
  type_error(fmt::format("bad operand type for unary -: '{}'", v.type_name()));
}

Value unary_plus(const Value& v) {
  if (v.is_undefined()) undefined_error(v);
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) return v;
  type_error(fmt::format("bad operand type for unary +: '{}'", v.type_name()));
}

// ---- Iteration, length, membership ----

ValueList iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kString: {
      ValueList out;
      const std::string& s = value.as_string();
      for (size_t i = 0; i < s.size();) {
        size_t len;
        text::decode(s, i, len);
        out.push_back(Value::string(s.substr(i, len)));
        i += len;
      }
      return out;
    }
    case Value::Kind::kSeq:
      return value.as_seq();
    case Value::Kind::kDict: {
      ValueList out;
      for (const auto& [k, v] : value.as_dict().items) out.push_back(Value::string(k));
      return out;
    }
    case Value::Kind::kIterator: {
      IteratorState& it = value.as_iterator();
      if (it.used) {
        throw TemplateError(
            "an iterator (from reverse, map, select, items, ...) used a second time is not "
            "supported (Python finds it exhausted)");
      }
      it.used = true;
      return it.items;
    }
    default:
      type_error(fmt::format("'{}' object is not iterable", value.type_name()));
  }
}

int64_t length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return text::length(value.as_string());
    case Value::Kind::kSeq:
      return static_cast<int64_t>(value.as_seq().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(value.as_dict().items.size());
    case Value::Kind::kLoop:
      return static_cast<int64_t>(value.as_loop().items->size());
    default:
      type_error(fmt::format("object of type '{}' has no len()", value.type_name()));
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (item.is_undefined()) undefined_error(item);
      if (!item.is_string()) {
        type_error(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kDict:
      if (item.is_list() || item.is_dict() || (item.is_seq() && item.seq_kind() == SeqKind::kView)) {
        type_error(fmt::format("unhashable type: '{}'", item.type_name()));
      }
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    case Value::Kind::kSeq:
    case Value::Kind::kIterator:
      for (const Value& v : iterate(container)) {
        if (equals(v, item)) return true;
      }
      return false;
    default:
      type_error(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }
}

// ---- Attribute and item access ----

namespace {

Value bind_method(const Value& self, std::string_view type, std::string_view name);

constexpr std::array<std::string_view, 11> kDictMethods = {
    "clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values"};
constexpr std::array<std::string_view, 47> kStrMethods = {
    "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
    "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
    "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
    "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
    "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
    "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
    "swapcase",   "title",        "translate",    "upper",   "zfill"};
constexpr std::array<std::string_view, 11> kListMethods = {
    "append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort"};
constexpr std::array<std::string_view, 13> kNumberAttrs = {
    "as_integer_ratio", "bit_count", "bit_length", "conjugate", "denominator",
    "from_bytes",       "fromhex",   "hex",        "imag",      "is_integer",
    "numerator",        "real",      "to_bytes"};

template <size_t N>
bool in(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Value no_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_name(obj), name));
}

Value loop_attr(const Value& loop, const std::string& name) {
  const LoopState& s = loop.as_loop();
  const auto n = static_cast<int64_t>(s.items->size());
  if (name == "index0") return Value::integer(s.index0);
  if (name == "index") return Value::integer(s.index0 + 1);
  if (name == "revindex0") return Value::integer(n - s.index0 - 1);
  if (name == "revindex") return Value::integer(n - s.index0);
  if (name == "first") return Value::boolean(s.index0 == 0);
  if (name == "last") return Value::boolean(s.index0 == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem") {
    if (s.index0 == 0) return Value::undefined("there is no previous item");
    return (*s.items)[static_cast<size_t>(s.index0 - 1)];
  }
  if (name == "nextitem") {
    if (s.index0 + 1 >= n) return Value::undefined("there is no next item");
    return (*s.items)[static_cast<size_t>(s.index0 + 1)];
  }
  if (name == "cycle" || name == "changed") return bind_method(loop, "loop", name);
  return no_attribute(loop, name);
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (name.starts_with("__")) {
    throw TemplateError(
        fmt::format("access to attribute '{}' is not supported (the sandbox's unsafe names)", name));
  }
  switch (obj.kind()) {
    case Value::Kind::kDict:
      if (in(kDictMethods, name)) return bind_method(obj, "dict", name);
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return no_attribute(obj, name);
    case Value::Kind::kString:
      if (in(kStrMethods, name)) return bind_method(obj, "str", name);
      return no_attribute(obj, name);
    case Value::Kind::kSeq:
      if (in(kListMethods, name) && obj.seq_kind() != SeqKind::kView) {
        throw TemplateError(fmt::format("the {} method '{}' is not supported", obj.type_name(), name));
      }
      if (obj.seq_kind() == SeqKind::kRange && (name == "start" || name == "stop" || name == "step")) {
        throw TemplateError(fmt::format("range.{} is not supported", name));
      }
      if (obj.seq_kind() == SeqKind::kView && (name == "mapping" || name == "isdisjoint")) {
        throw TemplateError(fmt::format("the dict view attribute '{}' is not supported", name));
      }
      return no_attribute(obj, name);
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      if (in(kNumberAttrs, name)) {
        throw TemplateError(fmt::format("the {} attribute '{}' is not supported", obj.type_name(), name));
      }
      return no_attribute(obj, name);
    case Value::Kind::kNamespace:
      if (Value* v = obj.as_namespace().find(name)) return *v;
      return no_attribute(obj, name);
    case Value::Kind::kLoop:
      return loop_attr(obj, name);
    default:
      return no_attribute(obj, name);
  }
}

namespace {

// Python's slice.indices(len) and the indexes a slice selects.
std::vector<int64_t> slice_indexes(int64_t len, const Value* start_v, const Value* stop_v,
                                   const Value* step_v) {
  const int64_t step = step_v ? step_v->as_int() : 1;
  if (step == 0) throw TemplateError("slice step cannot be zero");
  auto adjust = [&](const Value* v, bool is_start) -> int64_t {
    if (v == nullptr) {
      if (is_start) return step < 0 ? len - 1 : 0;
      return step < 0 ? -1 : len;
    }
    int64_t i = v->as_int();
    if (i < 0) {
      i += len;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
    return i;
  };
  const int64_t start = adjust(start_v, true);
  const int64_t stop = adjust(stop_v, false);
  std::vector<int64_t> out;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) out.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) out.push_back(i);
  }
  return out;
}

}  // namespace

// jinja2 compiles a slice to Python's own obj[a:b:c], not through the sandbox's getitem: what cannot be
// sliced is a TypeError (an error), not an Undefined.
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined()) undefined_error(obj);
  auto absent_if_none = [](const Value* v) { return v != nullptr && v->is_none() ? nullptr : v; };
  start = absent_if_none(start);
  stop = absent_if_none(stop);
  step = absent_if_none(step);
  const bool sliceable = obj.is_string() || (obj.is_seq() && obj.seq_kind() != SeqKind::kView);
  if (!sliceable) type_error(fmt::format("'{}' object is not subscriptable with a slice", obj.type_name()));
  for (const Value* bound : {start, stop, step}) {
    if (bound != nullptr && !bound->is_integral()) {
      if (bound->is_undefined()) undefined_error(*bound);
      type_error("slice indices must be integers or None or have an __index__ method");
    }
  }
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    const std::vector<size_t> offsets = text::code_point_offsets(s);
    const auto n = static_cast<int64_t>(offsets.size() - 1);
    std::string out;
    const int64_t step_value = step ? step->as_int() : 1;
    const std::vector<int64_t> idx = slice_indexes(n, start, stop, step);
    if (step_value == 1 && !idx.empty()) {
      const size_t b = offsets[static_cast<size_t>(idx.front())];
      const size_t e = offsets[static_cast<size_t>(idx.back()) + 1];
      return Value::string(s.substr(b, e - b));
    }
    for (const int64_t i : idx) {
      const auto k = static_cast<size_t>(i);
      out.append(s, offsets[k], offsets[k + 1] - offsets[k]);
    }
    return Value::string(std::move(out));
  }
  const ValueList& items = obj.as_seq();
  ValueList out;
  for (const int64_t i : slice_indexes(static_cast<int64_t>(items.size()), start, stop, step)) {
    out.push_back(items[static_cast<size_t>(i)]);
  }
  return Value::list(std::move(out), obj.seq_kind());
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  switch (obj.kind()) {
    case Value::Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
      }
      break;
    case Value::Kind::kSeq:
      if (key.is_integral() && obj.seq_kind() != SeqKind::kView) {
        const ValueList& items = obj.as_seq();
        int64_t i = key.as_int();
        const auto n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        return Value::undefined(fmt::format("{} has no element {}", object_name(obj), key.as_int()));
      }
      break;
    case Value::Kind::kString:
      if (key.is_integral()) {
        const std::string& s = obj.as_string();
        const std::vector<size_t> offsets = text::code_point_offsets(s);
        const auto n = static_cast<int64_t>(offsets.size() - 1);
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          const auto k = static_cast<size_t>(i);
          return Value::string(s.substr(offsets[k], offsets[k + 1] - offsets[k]));
        }
        return Value::undefined(fmt::format("{} has no element {}", object_name(obj), key.as_int()));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    // jinja2's getitem falls back to the attribute of that name.
    return get_attr(obj, key.as_string());
  }
  return Value::undefined(fmt::format("{} has no element {}", object_name(obj), to_str(key)));
}

Value call_value(Env& env, const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (callee.kind() != Value::Kind::kCallable)
    type_error(fmt::format("'{}' object is not callable", callee.type_name()));
  env.step();
  return callee.as_callable().call(args);
}

// ---- Methods ----

namespace {

bool starts_or_ends(std::string_view func, const std::string& s, const Value& arg, bool start) {
  auto test = [&](const Value& v) {
    const std::string& p = str_arg(func, v);
    return start ? std::string_view(s).starts_with(p) : std::string_view(s).ends_with(p);
  };
  if (arg.is_tuple()) {
    return std::any_of(arg.as_seq().begin(), arg.as_seq().end(), test);
  }
  if (!arg.is_string()) {
    type_error(fmt::format("{} first arg must be str or a tuple of str, not {}", func, arg.type_name()));
  }
  return test(arg);
}

ValueList strings(const std::vector<std::string>& parts) {
  ValueList out;
  out.reserve(parts.size());
  for (const std::string& p : parts) out.push_back(Value::string(p));
  return out;
}

Value str_method(const Value& self, std::string_view name, CallArgs& args) {
  const std::string& s = self.as_string();
  const std::string func = fmt::format("str.{}", name);
  if (name == "startswith" || name == "endswith") {
    positional_count(func, args, 1, 1);
    return Value::boolean(starts_or_ends(func, s, args.positional[0], name == "startswith"));
  }
  if (name == "split" || name == "rsplit") {
    Params p(func, args, {"sep", "maxsplit"});
    const std::optional<std::string> sep = optional_str_arg(func, p.get(0));
    if (sep && sep->empty()) type_error("empty separator");
    const int64_t maxsplit = p.get(1) ? int_arg(func, *p.get(1)) : -1;
    return Value::list(strings(text::split(s, sep, maxsplit, name == "rsplit")));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    positional_count(func, args, 0, 1);
    const std::optional<std::string> chars =
        optional_str_arg(func, args.positional.empty() ? nullptr : &args.positional[0]);
    return Value::string(text::strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    positional_count(func, args, 0, 0);
    return Value::string(name == "upper"   ? text::upper(s)
                         : name == "lower" ? text::lower(s)
                                           : text::capitalize(s));
  }
  if (name == "replace") {
    positional_count(func, args, 2, 3);
    const int64_t count = args.positional.size() == 3 ? int_arg(func, args.positional[2]) : -1;
    return Value::string(
        text::replace(s, str_arg(func, args.positional[0]), str_arg(func, args.positional[1]), count));
  }
  if (name == "find" || name == "rfind") {
    positional_count(func, args, 1, 1);
    return Value::integer(text::find(s, str_arg(func, args.positional[0]), name == "rfind"));
  }
  if (name == "count") {
    positional_count(func, args, 1, 1);
    return Value::integer(text::count(s, str_arg(func, args.positional[0])));
  }
  if (name == "join") {
    positional_count(func, args, 1, 1);
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(args.positional[0])) {
      if (!item.is_string()) {
        type_error(fmt::format("sequence item {}: expected str instance, {} found", i, item.type_name()));
      }
      if (i++ > 0) out += s;
      out += item.as_string();
    }
    return Value::string(std::move(out));
  }
  throw TemplateError(fmt::format("the string method '{}' is not supported", name));
}

Value view(const Value& dict, std::string_view which) {
  ValueList out;
  for (const auto& [k, v] : dict.as_dict().items) {
    if (which == "items") {
      out.push_back(Value::list({Value::string(k), v}, SeqKind::kTuple));
    } else if (which == "keys") {
      out.push_back(Value::string(k));
    } else {
      out.push_back(v);
    }
  }
  return Value::list(std::move(out), SeqKind::kView);
}

Value dict_method(const Value& self, std::string_view name, CallArgs& args) {
  const std::string func = fmt::format("dict.{}", name);
  if (name == "get") {
    positional_count(func, args, 1, 2);
    const Value& key = args.positional[0];
    if (key.is_string()) {
      if (const Value* v = self.as_dict().find(key.as_string())) return *v;
    } else if (key.is_seq() && !key.is_tuple()) {
      type_error(fmt::format("unhashable type: '{}'", key.type_name()));
    }
    return args.positional.size() == 2 ? args.positional[1] : Value::none();
  }
  if (name == "items" || name == "keys" || name == "values") {
    positional_count(func, args, 0, 0);
    return view(self, name);
  }
  throw TemplateError(fmt::format("the dict method '{}' is not supported", name));
}

Value loop_method(const Value& self, std::string_view name, CallArgs& args) {
  LoopState& s = self.as_loop();
  if (name == "cycle") {
    no_keywords("loop.cycle", args);
    if (args.positional.empty()) type_error("no items for cycling given");
    return args.positional[static_cast<size_t>(s.index0) % args.positional.size()];
  }
  // loop.changed(*values): whether the values differ from those of its previous call.
  no_keywords("loop.changed", args);
  Value now = Value::list(args.positional, SeqKind::kTuple);
  if (s.last_changed && equals(*s.last_changed, now)) return Value::boolean(false);
  s.last_changed = std::make_shared<Value>(std::move(now));
  return Value::boolean(true);
}

Value bind_method(const Value& self, std::string_view type, std::string_view name) {
  const std::string method(name);
  if (type == "str") {
    if (method == "format" || method == "format_map") {
      throw TemplateError("str.format is not supported (the sandbox's own formatter)");
    }
    return Value::callable(
        "str." + method, [self, method](CallArgs& args) { return str_method(self, method, args); },
        self.depth());
  }
  if (type == "dict") {
    return Value::callable(
        "dict." + method, [self, method](CallArgs& args) { return dict_method(self, method, args); },
        self.depth());
  }
  return Value::callable("loop." + method,
                         [self, method](CallArgs& args) { return loop_method(self, method, args); });
}

}  // namespace

// ---- Globals ----

namespace {

Value make_range(Env& env, CallArgs& args) {
  positional_count("range", args, 1, 3);
  int64_t start = 0, stop, step = 1;
  if (args.positional.size() == 1) {
    stop = int_arg("range", args.positional[0]);
  } else {
    start = int_arg("range", args.positional[0]);
    stop = int_arg("range", args.positional[1]);
    if (args.positional.size() == 3) step = int_arg("range", args.positional[2]);
  }
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  ValueList out;
  constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox MAX_RANGE
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.push_back(Value::integer(i));
  }
  env.step(out.size());
  return Value::list(std::move(out), SeqKind::kRange);
}

// dict(*args, **kwargs) as namespace() and dict() take them: at most one positional mapping, then keywords.
std::vector<std::pair<std::string, Value>> dict_arguments(std::string_view func, CallArgs& args) {
  std::vector<std::pair<std::string, Value>> out;
  auto set = [&](const std::string& k, const Value& v) {
    for (auto& [key, value] : out) {
      if (key == k) {
        value = v;
        return;
      }
    }
    out.emplace_back(k, v);
  };
  if (args.positional.size() > 1)
    type_error(fmt::format("{} expected at most 1 argument, got {}", func, args.positional.size()));
  if (!args.positional.empty()) {
    const Value& m = args.positional[0];
    if (!m.is_dict())
      throw TemplateError(fmt::format("{}() from a {} is not supported (only a dict)", func, m.type_name()));
    for (const auto& [k, v] : m.as_dict().items) set(k, v);
  }
  for (const auto& [k, v] : args.keywords) set(k, v);
  return out;
}

Value strftime_now(CallArgs& args) {
  positional_count("strftime_now", args, 1, 1);
  const std::string& format = str_arg("strftime_now", args.positional[0]);
  timeval now{};
  gettimeofday(&now, nullptr);
  tm local{};
  const time_t seconds = now.tv_sec;
  localtime_r(&seconds, &local);
  // Python's datetime.strftime handles %f, %z and %Z itself (a naive datetime: %z and %Z are empty).
  std::string expanded;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      const char c = format[i + 1];
      if (c == 'f') {
        expanded += fmt::format("{:06d}", static_cast<int>(now.tv_usec));
        ++i;
        continue;
      }
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      expanded += format[i];
      expanded += c;
      ++i;
      continue;
    }
    expanded += format[i];
  }
  if (expanded.empty()) return Value::string("");
  std::string out(expanded.size() * 4 + 64, '\0');
  const size_t n = std::strftime(out.data(), out.size(), expanded.c_str(), &local);
  if (n == 0) throw TemplateError("strftime_now: the formatted time is too long");
  out.resize(n);
  return Value::string(std::move(out));
}

}  // namespace

Value find_global(std::string_view name, bool& found, Env& env) {
  found = true;
  if (name == "range") {
    return Value::callable("range", [&env](CallArgs& args) { return make_range(env, args); });
  }
  if (name == "namespace") {
    return Value::callable("namespace", [&env](CallArgs& args) {
      auto state = std::make_shared<NamespaceState>();
      state->attrs = dict_arguments("namespace", args);
      env.namespaces.push_back(state);
      return Value::namespace_object(std::move(state));
    });
  }
  if (name == "dict") {
    return Value::callable("dict", [](CallArgs& args) {
      DictEntries entries;
      entries.items = dict_arguments("dict", args);
      return Value::dict(std::move(entries));
    });
  }
  if (name == "raise_exception") {
    return Value::callable("raise_exception", [](CallArgs& args) -> Value {
      positional_count("raise_exception", args, 1, 1);
      throw TemplateError(fmt::format("the template raised an exception: {}", to_str(args.positional[0])));
    });
  }
  if (name == "strftime_now") return Value::callable("strftime_now", strftime_now);
  if (name == "lipsum" || name == "cycler" || name == "joiner") {
    const std::string n(name);
    return Value::callable(
        n, [n](CallArgs&) -> Value { throw TemplateError(fmt::format("{}() is not supported", n)); });
  }
  found = false;
  return Value();
}

// ---- Filters ----

namespace {

using FilterFn = Value (*)(Env&, const Value&, CallArgs&);
using TestFn = bool (*)(Env&, const Value&, CallArgs&);

// jinja2's make_attrgetter: "a.b.0" looked up part by part with getitem's rules.
Value attr_path(const Value& item, const Value& attribute, const Value* default_value) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& part : text::split(attribute.as_string(), std::string("."), -1, false)) {
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits && part.size() < 18) {
        parts.push_back(Value::integer(std::stoll(part)));
      } else if (digits) {
        throw TemplateError("an attribute path with a number above 64 bits is not supported");
      } else {
        parts.push_back(Value::string(part));
      }
    }
  } else if (!attribute.is_none()) {
    parts.push_back(attribute);
  }
  Value v = item;
  for (const Value& part : parts) {
    v = get_item(v, part);
    if (default_value != nullptr && !default_value->is_none() && v.is_undefined()) v = *default_value;
  }
  return v;
}

Value filter_abs(Env&, const Value& v, CallArgs& args) {
  positional_count("abs", args, 0, 0);
  if (v.is_integral()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) checked(true, 0);
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_float()) return Value::floating(std::fabs(v.as_float()));
  if (v.is_undefined()) undefined_error(v);
  type_error(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
}

Value filter_capitalize(Env&, const Value& v, CallArgs& args) {
  positional_count("capitalize", args, 0, 0);
  return Value::string(text::capitalize(soft_str(v)));
}

Value filter_title(Env&, const Value& v, CallArgs& args) {
  positional_count("title", args, 0, 0);
  // jinja2's do_title: split at runs of -, whitespace, ( { [ < (kept), then each piece's first character
  // upper-cased and the rest lower-cased.
  const std::string s = soft_str(v);
  std::string out;
  size_t i = 0;
  auto is_sep = [](char32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || text::is_space(cp);
  };
  while (i < s.size()) {
    size_t len;
    const bool sep = is_sep(text::decode(s, i, len));
    const size_t begin = i;
    while (i < s.size() && is_sep(text::decode(s, i, len)) == sep) i += len;
    const std::string_view piece(s.data() + begin, i - begin);
    text::decode(piece, 0, len);
    out += text::upper(piece.substr(0, len));
    out += text::lower(piece.substr(len));
  }
  return Value::string(std::move(out));
}

Value filter_length(Env&, const Value& v, CallArgs& args) {
  positional_count("length", args, 0, 0);
  return Value::integer(length(v));
}

Value filter_default(Env&, const Value& v, CallArgs& args) {
  Params p("default", args, {"default_value", "boolean"});
  const bool boolean = p.get(1) != nullptr && truthy(*p.get(1));
  if (v.is_undefined() || (boolean && !truthy(v))) return p.get(0) ? *p.get(0) : Value::string("");
  return v;
}

Value filter_first(Env&, const Value& v, CallArgs& args) {
  positional_count("first", args, 0, 0);
  // next(iter(value)); an iterator is spent by it here (Python would keep the rest for a later use, which
  // iterate() refuses).
  const ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value filter_last(Env&, const Value& v, CallArgs& args) {
  positional_count("last", args, 0, 0);
  if (v.kind() == Value::Kind::kIterator) type_error("'generator' object is not reversible");
  if (!v.is_undefined() && !v.is_string() && !v.is_seq() && !v.is_dict()) {
    type_error(fmt::format("'{}' object is not reversible", v.type_name()));
  }
  const ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float(str): surrounding whitespace, a sign, digits with single underscores between them, an
// optional fraction and exponent, or inf/infinity/nan in any case. nullopt when Python raises ValueError.
std::optional<double> parse_python_float(const std::string& raw) {
  const std::string s = text::strip(raw, std::nullopt, true, true);
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80)
      throw TemplateError("float() of non-ASCII digits is not supported");
  }
  std::string body = s;
  std::string sign;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body.substr(0, 1);
    body = body.substr(1);
  }
  const std::string lower_body = text::lower(body);
  if (lower_body == "inf" || lower_body == "infinity") {
    return sign == "-" ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (lower_body == "nan") return std::numeric_limits<double>::quiet_NaN();
  // digits: (\d(_?\d)*)?(\.(\d(_?\d)*)?)?([eE][+-]?\d(_?\d)*)? with at least one digit in the mantissa.
  std::string clean;
  size_t i = 0;
  auto digit_run = [&]() {
    size_t n = 0;
    while (i < body.size()) {
      if (body[i] >= '0' && body[i] <= '9') {
        clean += body[i++];
        ++n;
      } else if (body[i] == '_' && n > 0 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '9') {
        ++i;
      } else {
        break;
      }
    }
    return n;
  };
  size_t mantissa = digit_run();
  if (i < body.size() && body[i] == '.') {
    clean += body[i++];
    mantissa += digit_run();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    clean += 'e';
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) clean += body[i++];
    if (digit_run() == 0) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  double value = 0;
  const auto r = std::from_chars(clean.data(), clean.data() + clean.size(), value);
  if (r.ec == std::errc::result_out_of_range) {
    const size_t e = clean.find('e');
    value = e != std::string::npos && clean[e + 1] == '-' ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return sign == "-" ? -value : value;
}

// Python's int(str, base) for bases 2..36 and 0; nullopt when Python raises ValueError.
std::optional<int64_t> parse_python_int(const std::string& raw, int64_t base) {
  const std::string s = text::strip(raw, std::nullopt, true, true);
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80)
      throw TemplateError("int() of non-ASCII digits is not supported");
  }
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  auto prefix_base = [](char c) { return c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0; };
  const bool base_zero = base == 0;
  bool prefixed = false;
  if (i + 1 < s.size() && s[i] == '0') {
    const int pb = prefix_base(static_cast<char>(s[i + 1] | 0x20));
    if (pb != 0 && (base == 0 || base == pb)) {
      base = pb;
      i += 2;
      prefixed = true;
    }
  }
  if (base == 0) base = 10;
  const size_t digits_begin = i;
  uint64_t value = 0;
  bool any = false;
  bool last_underscore = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      // One underscore between digits, or right after a base prefix ("0x_1f").
      if (!((any && !last_underscore) || (prefixed && i == digits_begin))) return std::nullopt;
      last_underscore = true;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (d >= base) return std::nullopt;
    if (value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1 - static_cast<uint64_t>(d)) /
                    static_cast<uint64_t>(base)) {
      throw TemplateError("int() of a number above 64 bits is not supported");
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    any = true;
    last_underscore = false;
  }
  if (!any || last_underscore) return std::nullopt;
  // int(x, 0) refuses a nonzero decimal with a leading zero ("012").
  if (base_zero && !prefixed && s[digits_begin] == '0' && value != 0) return std::nullopt;
  if (!negative && value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw TemplateError("int() of a number above 64 bits is not supported");
  }
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

std::optional<int64_t> float_to_int(double f) {
  if (std::isnan(f)) return std::nullopt;  // ValueError
  if (std::isinf(f)) throw TemplateError("cannot convert float infinity to integer");
  const double t = std::trunc(f);
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) {
    throw TemplateError("int() of a number above 64 bits is not supported");
  }
  return static_cast<int64_t>(t);
}

Value filter_int(Env&, const Value& v, CallArgs& args) {
  Params p("int", args, {"default", "base"});
  const Value default_value = p.get(0) ? *p.get(0) : Value::integer(0);
  const int64_t base = p.get(1) ? int_arg("int", *p.get(1)) : 10;
  if (v.is_undefined()) undefined_error(v);
  if (v.is_string()) {
    if (base != 0 && (base < 2 || base > 36)) return default_value;  // ValueError, then float() of it
    if (auto i = parse_python_int(v.as_string(), base)) return Value::integer(*i);
    if (auto f = parse_python_float(v.as_string())) {
      if (auto i = float_to_int(*f)) return Value::integer(*i);
    }
    return default_value;
  }
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    if (auto i = float_to_int(v.as_float())) return Value::integer(*i);
    return default_value;
  }
  return default_value;  // TypeError, then float() of it: TypeError
}

Value filter_float(Env&, const Value& v, CallArgs& args) {
  Params p("float", args, {"default"});
  const Value default_value = p.get(0) ? *p.get(0) : Value::floating(0.0);
  if (v.is_undefined()) undefined_error(v);
  if (v.is_number()) return Value::floating(v.as_number());
  if (v.is_string()) {
    if (auto f = parse_python_float(v.as_string())) return Value::floating(*f);
  }
  return default_value;
}

Value filter_items(Env&, const Value& v, CallArgs& args) {
  positional_count("items", args, 0, 0);
  if (v.is_undefined()) return Value::iterator({});
  if (!v.is_dict())
    type_error(fmt::format("Can only get item pairs from a mapping, not a {}", v.type_name()));
  return Value::iterator(view(v, "items").as_seq());
}

Value filter_join(Env& env, const Value& v, CallArgs& args) {
  Params p("join", args, {"d", "attribute"});
  const std::string d = p.get(0) ? to_str(*p.get(0)) : "";
  std::string out;
  size_t i = 0;
  for (const Value& raw : iterate(v)) {
    const Value item = p.get(1) ? attr_path(raw, *p.get(1), nullptr) : raw;
    if (i++ > 0) out += d;
    append_str(out, item);
    env.check_string(out.size());
  }
  env.step(i);
  return Value::string(std::move(out));
}

Value filter_list(Env& env, const Value& v, CallArgs& args) {
  positional_count("list", args, 0, 0);
  ValueList items = iterate(v);
  env.check_items(items.size());
  env.step(items.size());
  return Value::list(std::move(items));
}

Value filter_lower(Env&, const Value& v, CallArgs& args) {
  positional_count("lower", args, 0, 0);
  return Value::string(text::lower(soft_str(v)));
}

Value filter_upper(Env&, const Value& v, CallArgs& args) {
  positional_count("upper", args, 0, 0);
  return Value::string(text::upper(soft_str(v)));
}

Value filter_replace(Env& env, const Value& v, CallArgs& args) {
  Params p("replace", args, {"old", "new", "count"}, 2);
  const int64_t count = p.get(2) && !p.get(2)->is_none() ? int_arg("replace", *p.get(2)) : -1;
  const std::string s = to_str(v);
  const std::string old_text = to_str(*p.get(0));
  const std::string new_text = to_str(*p.get(1));
  if (new_text.size() > old_text.size()) {
    const int64_t n = text::count(s, old_text);
    const uint64_t times = count < 0
                               ? static_cast<uint64_t>(n)
                               : std::min<uint64_t>(static_cast<uint64_t>(n), static_cast<uint64_t>(count));
    env.check_string(s.size() + times * (new_text.size() - old_text.size()));
  }
  env.step(s.size() / 256);
  return Value::string(text::replace(s, old_text, new_text, count));
}

Value filter_reverse(Env&, const Value& v, CallArgs& args) {
  positional_count("reverse", args, 0, 0);
  if (v.is_string()) {
    const std::string& s = v.as_string();
    std::string out;
    out.reserve(s.size());
    size_t end = s.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
      out.append(s, start, end - start);
      end = start;
    }
    return Value::string(std::move(out));
  }
  if (v.kind() == Value::Kind::kIterator) {
    // reversed() of a generator fails; jinja2 then reverses list(value): a list.
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (v.is_undefined() || v.is_seq() || v.is_dict()) {
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::iterator(std::move(items));
  }
  type_error("argument must be iterable");
}

Value filter_string(Env&, const Value& v, CallArgs& args) {
  positional_count("string", args, 0, 0);
  return Value::string(soft_str(v));
}

Value filter_trim(Env&, const Value& v, CallArgs& args) {
  Params p("trim", args, {"chars"});
  return Value::string(text::strip(soft_str(v), optional_str_arg("trim", p.get(0)), true, true));
}

Value filter_tojson(Env& env, const Value& v, CallArgs& args) {
  Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  if (p.get(0)) o.ensure_ascii = truthy(*p.get(0));
  if (const Value* indent = p.get(1); indent != nullptr && !indent->is_none()) {
    o.has_indent = true;
    if (indent->is_integral()) {
      o.indent = std::string(
          static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent->as_int(), 1000))), ' ');
    } else if (indent->is_string()) {
      o.indent = indent->as_string();
    } else {
      type_error(fmt::format("tojson: indent must be an int or a str, not {}", indent->type_name()));
    }
  }
  if (const Value* sep = p.get(2); sep != nullptr && !sep->is_none()) {
    if (!sep->is_seq() || sep->as_seq().size() != 2 || !sep->as_seq()[0].is_string() ||
        !sep->as_seq()[1].is_string()) {
      type_error("tojson: separators must be a pair of strings");
    }
    o.has_separators = true;
    o.item_separator = sep->as_seq()[0].as_string();
    o.key_separator = sep->as_seq()[1].as_string();
  }
  if (p.get(3)) o.sort_keys = truthy(*p.get(3));
  std::string out = python_json_dumps(v, o);
  env.check_string(out.size());
  env.step(out.size() / 256);
  return Value::string(std::move(out));
}

Value filter_map(Env& env, const Value& v, CallArgs& args);
Value select_or_reject(Env& env, const Value& v, CallArgs& args, bool select, bool by_attribute);
Value filter_select(Env& env, const Value& v, CallArgs& args) {
  return select_or_reject(env, v, args, true, false);
}
Value filter_reject(Env& env, const Value& v, CallArgs& args) {
  return select_or_reject(env, v, args, false, false);
}
Value filter_selectattr(Env& env, const Value& v, CallArgs& args) {
  return select_or_reject(env, v, args, true, true);
}
Value filter_rejectattr(Env& env, const Value& v, CallArgs& args) {
  return select_or_reject(env, v, args, false, true);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", filter_abs},
    {"capitalize", filter_capitalize},
    {"count", filter_length},
    {"d", filter_default},
    {"default", filter_default},
    {"first", filter_first},
    {"float", filter_float},
    {"int", filter_int},
    {"items", filter_items},
    {"join", filter_join},
    {"last", filter_last},
    {"length", filter_length},
    {"list", filter_list},
    {"lower", filter_lower},
    {"map", filter_map},
    {"reject", filter_reject},
    {"rejectattr", filter_rejectattr},
    {"replace", filter_replace},
    {"reverse", filter_reverse},
    {"select", filter_select},
    {"selectattr", filter_selectattr},
    {"string", filter_string},
    {"title", filter_title},
    {"tojson", filter_tojson},
    {"trim", filter_trim},
    {"upper", filter_upper},
};

// jinja2's other built-in filters: refused by name.
constexpr std::string_view kJinja2OnlyFilters[] = {
    "attr",        "batch",  "center",    "dictsort", "e",         "escape",    "filesizeformat",
    "forceescape", "format", "groupby",   "indent",   "max",       "min",       "pprint",
    "random",      "round",  "safe",      "slice",    "sort",      "striptags", "sum",
    "truncate",    "unique", "urlencode", "urlize",   "wordcount", "wordwrap",  "xmlattr",
};

// ---- Tests ----

bool test_defined(Env&, const Value& v, CallArgs& a) {
  positional_count("defined", a, 0, 0);
  return !v.is_undefined();
}
bool test_undefined(Env&, const Value& v, CallArgs& a) {
  positional_count("undefined", a, 0, 0);
  return v.is_undefined();
}
bool test_none(Env&, const Value& v, CallArgs& a) {
  positional_count("none", a, 0, 0);
  return v.is_none();
}
bool test_boolean(Env&, const Value& v, CallArgs& a) {
  positional_count("boolean", a, 0, 0);
  return v.is_bool();
}
bool test_true(Env&, const Value& v, CallArgs& a) {
  positional_count("true", a, 0, 0);
  return v.is_bool() && v.as_bool();
}
bool test_false(Env&, const Value& v, CallArgs& a) {
  positional_count("false", a, 0, 0);
  return v.is_bool() && !v.as_bool();
}
bool test_integer(Env&, const Value& v, CallArgs& a) {
  positional_count("integer", a, 0, 0);
  return v.is_int();
}
bool test_float(Env&, const Value& v, CallArgs& a) {
  positional_count("float", a, 0, 0);
  return v.is_float();
}
bool test_number(Env&, const Value& v, CallArgs& a) {
  positional_count("number", a, 0, 0);
  return v.is_number();
}
bool test_string(Env&, const Value& v, CallArgs& a) {
  positional_count("string", a, 0, 0);
  return v.is_string();
}
bool test_mapping(Env&, const Value& v, CallArgs& a) {
  positional_count("mapping", a, 0, 0);
  return v.is_dict();
}
bool test_sequence(Env&, const Value& v, CallArgs& a) {
  positional_count("sequence", a, 0, 0);
  // len() and __getitem__: str, list, tuple, range, dict, and Undefined (which has both).
  return v.is_undefined() || v.is_string() || v.is_dict() || (v.is_seq() && v.seq_kind() != SeqKind::kView);
}
bool test_iterable(Env&, const Value& v, CallArgs& a) {
  positional_count("iterable", a, 0, 0);
  return v.is_undefined() || v.is_string() || v.is_seq() || v.is_dict() ||
         v.kind() == Value::Kind::kIterator || v.kind() == Value::Kind::kLoop;
}
bool test_callable(Env&, const Value& v, CallArgs& a) {
  positional_count("callable", a, 0, 0);
  // Undefined and LoopContext define __call__.
  return v.kind() == Value::Kind::kCallable || v.is_undefined() || v.kind() == Value::Kind::kLoop;
}
bool test_sameas(Env&, const Value& v, CallArgs& a) {
  positional_count("sameas", a, 1, 1);
  const Value& other = a.positional[0];
  // Identity is well defined for None, True and False; for other values it depends on Python's object reuse.
  const bool singleton = v.is_none() || v.is_bool();
  const bool other_singleton = other.is_none() || other.is_bool();
  if (!singleton && !other_singleton)
    throw TemplateError("'sameas' is only supported with none, true or false");
  return v.kind() == other.kind() && v.same_object(other);
}
bool test_escaped(Env&, const Value&, CallArgs& a) {
  positional_count("escaped", a, 0, 0);
  return false;
}

bool modulo_equals(Env& env, const Value& v, const Value& divisor, int64_t expected) {
  return equals(binary(env, Expr::BinOp::kMod, v, divisor), Value::integer(expected));
}
bool test_odd(Env& env, const Value& v, CallArgs& a) {
  positional_count("odd", a, 0, 0);
  return modulo_equals(env, v, Value::integer(2), 1);
}
bool test_even(Env& env, const Value& v, CallArgs& a) {
  positional_count("even", a, 0, 0);
  return modulo_equals(env, v, Value::integer(2), 0);
}
bool test_divisibleby(Env& env, const Value& v, CallArgs& a) {
  Params p("divisibleby", a, {"num"}, 1);
  return modulo_equals(env, v, *p.get(0), 0);
}

// Python's str.islower()/isupper(): some cased character, and every cased one of that case.
bool case_test(const Value& v, bool want_lower) {
  const std::string s = to_str(v);
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const auto cp = static_cast<UChar32>(text::decode(s, i, len));
    i += len;
    const bool is_upper = u_hasBinaryProperty(cp, UCHAR_UPPERCASE) != 0;
    const bool is_lower = u_hasBinaryProperty(cp, UCHAR_LOWERCASE) != 0;
    const bool is_title = u_charType(cp) == U_TITLECASE_LETTER;
    if (want_lower) {
      if (is_upper || is_title) return false;
      if (is_lower) cased = true;
    } else {
      if (is_lower || is_title) return false;
      if (is_upper) cased = true;
    }
  }
  return cased;
}
bool test_lower(Env&, const Value& v, CallArgs& a) {
  positional_count("lower", a, 0, 0);
  return case_test(v, true);
}
bool test_upper(Env&, const Value& v, CallArgs& a) {
  positional_count("upper", a, 0, 0);
  return case_test(v, false);
}

const Value& other_arg(std::string_view name, CallArgs& a) {
  positional_count(name, a, 1, 1);
  return a.positional[0];
}
bool test_eq(Env&, const Value& v, CallArgs& a) {
  return equals(v, other_arg("eq", a));
}
bool test_ne(Env&, const Value& v, CallArgs& a) {
  return !equals(v, other_arg("ne", a));
}
bool test_lt(Env&, const Value& v, CallArgs& a) {
  return compare(v, other_arg("lt", a), CompareOp::kLt);
}
bool test_le(Env&, const Value& v, CallArgs& a) {
  return compare(v, other_arg("le", a), CompareOp::kLe);
}
bool test_gt(Env&, const Value& v, CallArgs& a) {
  return compare(v, other_arg("gt", a), CompareOp::kGt);
}
bool test_ge(Env&, const Value& v, CallArgs& a) {
  return compare(v, other_arg("ge", a), CompareOp::kGe);
}
bool test_in(Env&, const Value& v, CallArgs& a) {
  return contains(other_arg("in", a), v);
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"defined", test_defined},
    {"undefined", test_undefined},
    {"none", test_none},
    {"boolean", test_boolean},
    {"true", test_true},
    {"false", test_false},
    {"integer", test_integer},
    {"float", test_float},
    {"number", test_number},
    {"string", test_string},
    {"mapping", test_mapping},
    {"sequence", test_sequence},
    {"iterable", test_iterable},
    {"callable", test_callable},
    {"sameas", test_sameas},
    {"escaped", test_escaped},
    {"odd", test_odd},
    {"even", test_even},
    {"divisibleby", test_divisibleby},
    {"lower", test_lower},
    {"upper", test_upper},
    {"eq", test_eq},
    {"equalto", test_eq},
    {"==", test_eq},
    {"ne", test_ne},
    {"!=", test_ne},
    {"lt", test_lt},
    {"lessthan", test_lt},
    {"<", test_lt},
    {"le", test_le},
    {"<=", test_le},
    {"gt", test_gt},
    {"greaterthan", test_gt},
    {">", test_gt},
    {"ge", test_ge},
    {">=", test_ge},
    {"in", test_in},
};

constexpr std::string_view kJinja2OnlyTests[] = {"filter", "test"};

int test_index(std::string_view name) {
  for (size_t i = 0; i < std::size(kTests); ++i) {
    if (kTests[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int filter_index(std::string_view name) {
  for (size_t i = 0; i < std::size(kFilters); ++i) {
    if (kFilters[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Value filter_map(Env& env, const Value& v, CallArgs& args) {
  if (!truthy(v)) return Value::iterator({});
  ValueList out;
  if (args.positional.empty() && !args.keywords.empty() &&
      std::any_of(args.keywords.begin(), args.keywords.end(),
                  [](const auto& kw) { return kw.first == "attribute"; })) {
    Params p("map", args, {"attribute", "default"});
    for (const Value& item : iterate(v)) out.push_back(attr_path(item, *p.get(0), p.get(1)));
  } else {
    if (args.positional.empty()) type_error("map requires a filter argument");
    const Value name = args.positional[0];
    const int index = name.is_string() ? filter_index(name.as_string()) : -1;
    if (index < 0) throw TemplateError(fmt::format("map: no supported filter named '{}'", to_str(name)));
    for (const Value& item : iterate(v)) {
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keywords = args.keywords;
      out.push_back(kFilters[index].fn(env, item, rest));
    }
  }
  env.step(out.size());
  return Value::iterator(std::move(out));
}

Value select_or_reject(Env& env, const Value& v, CallArgs& args, bool select, bool by_attribute) {
  if (!truthy(v)) return Value::iterator({});
  size_t off = 0;
  const Value* attribute = nullptr;
  if (by_attribute) {
    if (args.positional.empty()) type_error("Missing parameter for attribute name");
    attribute = &args.positional[0];
    off = 1;
  }
  int index = -1;
  if (args.positional.size() > off) {
    const Value& name = args.positional[off];
    index = name.is_string() ? test_index(name.as_string()) : -1;
    if (index < 0) throw TemplateError(fmt::format("no supported test named '{}'", to_str(name)));
  }
  ValueList out;
  for (const Value& item : iterate(v)) {
    const Value subject = attribute ? attr_path(item, *attribute, nullptr) : item;
    bool ok;
    if (index < 0) {
      ok = truthy(subject);
    } else {
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(off) + 1,
                             args.positional.end());
      rest.keywords = args.keywords;
      ok = kTests[index].fn(env, subject, rest);
    }
    if (ok == select) out.push_back(item);
  }
  env.step(out.size());
  return Value::iterator(std::move(out));
}

}  // namespace

int find_filter(std::string_view name, bool& jinja2_has) {
  const int index = filter_index(name);
  jinja2_has = index >= 0 || std::find(std::begin(kJinja2OnlyFilters), std::end(kJinja2OnlyFilters), name) !=
                                 std::end(kJinja2OnlyFilters);
  return index;
}

Value apply_filter(int index, Env& env, const Value& value, CallArgs& args) {
  env.step();
  return kFilters[index].fn(env, value, args);
}

int find_test(std::string_view name, bool& jinja2_has) {
  const int index = test_index(name);
  jinja2_has = index >= 0 || std::find(std::begin(kJinja2OnlyTests), std::end(kJinja2OnlyTests), name) !=
                                 std::end(kJinja2OnlyTests);
  return index;
}

bool apply_test(int index, Env& env, const Value& value, CallArgs& args) {
  env.step();
  return kTests[index].fn(env, value, args);
}

}  // namespace crescent::jinja
