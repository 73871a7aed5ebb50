#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "jinja/text.h"

namespace crescent::jinja {

const Value* DictEntries::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* NamespaceState::find(std::string_view name) {
  for (auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v(Kind::kUndefined);
  v.ptr_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::boolean(bool b) {
  Value v(Kind::kBool);
  v.i_ = b ? 1 : 0;  // also readable as_int(), as Python's bool is an int
  return v;
}

Value Value::integer(int64_t i) {
  Value v(Kind::kInt);
  v.i_ = i;
  return v;
}

Value Value::floating(double f) {
  Value v(Kind::kFloat);
  v.f_ = f;
  return v;
}

Value Value::string(std::string s) {
  return string(std::make_shared<const std::string>(std::move(s)));
}

Value Value::string(std::shared_ptr<const std::string> s) {
  Value v(Kind::kString);
  v.ptr_ = std::move(s);
  return v;
}

namespace {

// 1 + the deepest of `items`; throws past kMaxValueDepth.
uint16_t container_depth(const ValueList& items) {
  int deepest = 0;
  for (const Value& item : items) deepest = std::max(deepest, item.depth());
  if (deepest + 1 > kMaxValueDepth) {
    throw TemplateError(fmt::format("a value nested deeper than {} levels is not supported", kMaxValueDepth));
  }
  return static_cast<uint16_t>(deepest + 1);
}

}  // namespace

Value Value::list(ValueList items, SeqKind kind) {
  Value v(Kind::kSeq);
  v.seq_kind_ = kind;
  v.depth_ = container_depth(items);
  v.ptr_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::dict(DictEntries entries) {
  Value v(Kind::kDict);
  int deepest = 0;
  for (const auto& [k, item] : entries.items) deepest = std::max(deepest, item.depth());
  if (deepest + 1 > kMaxValueDepth) {
    throw TemplateError(fmt::format("a value nested deeper than {} levels is not supported", kMaxValueDepth));
  }
  v.depth_ = static_cast<uint16_t>(deepest + 1);
  v.ptr_ = std::make_shared<const DictEntries>(std::move(entries));
  return v;
}

Value Value::namespace_object(std::shared_ptr<NamespaceState> state) {
  Value v(Kind::kNamespace);
  v.ptr_ = std::move(state);
  return v;
}

Value Value::loop(std::shared_ptr<LoopState> state) {
  Value v(Kind::kLoop);
  v.ptr_ = std::move(state);
  return v;
}

Value Value::callable(std::string name, std::function<Value(CallArgs&)> call, int holds_depth) {
  Value v(Kind::kCallable);
  if (holds_depth + 1 > kMaxValueDepth) {
    throw TemplateError(fmt::format("a value nested deeper than {} levels is not supported", kMaxValueDepth));
  }
  v.depth_ = static_cast<uint16_t>(holds_depth + 1);
  v.ptr_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(call)});
  return v;
}

Value Value::iterator(ValueList items) {
  Value v(Kind::kIterator);
  v.depth_ = container_depth(items);
  auto state = std::make_shared<IteratorState>();
  state->items = std::move(items);
  v.ptr_ = std::move(state);
  return v;
}

std::string Value::undefined_hint() const {
  if (const auto* p = std::get_if<std::shared_ptr<const std::string>>(&ptr_)) return **p;
  return "a value is undefined";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kSeq:
      switch (seq_kind_) {
        case SeqKind::kList:
          return "list";
        case SeqKind::kTuple:
          return "tuple";
        case SeqKind::kView:
          return "dict view";
        case SeqKind::kRange:
          return "range";
      }
      return "sequence";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kLoop:
      return "LoopContext";
    case Kind::kCallable:
      return "function";
    case Kind::kIterator:
      return "iterator";
  }
  return "object";
}

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
    case Kind::kInt:
      return i_ == other.i_;
    case Kind::kFloat:
      return f_ == other.f_;
    default:
      return ptr_ == other.ptr_;
  }
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kSeq:
      return !v.as_seq().empty();
    case Value::Kind::kDict:
      return !v.as_dict().items.empty();
    case Value::Kind::kLoop:
      return !v.as_loop().items->empty();  // LoopContext's __len__
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
    case Value::Kind::kIterator:
      return true;
  }
  return true;
}

std::string python_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(result.ptr - buf));  // [-]d[.ddd]e[+-]dd
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e_at = sci.find('e');
  std::string digits;
  for (const char c : sci.substr(0, e_at)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(sci.data() + e_at + 1 + (sci[e_at + 1] == '+'), sci.data() + sci.size(), exponent);
  const int decpt = exponent + 1;  // digits[0] sits just left of the decimal point when decpt == 1
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

namespace {

void append_repr(std::string& out, const Value& v);

void append_string_repr(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x80) {
      throw TemplateError(
          "printing a list or dict that holds non-ASCII text is not supported (Python's repr escapes by its "
          "Unicode database)");
    }
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (b < 0x20 || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += c;
    }
  }
  out += quote;
}

[[noreturn]] void throw_unprintable(const Value& v) {
  throw TemplateError(
      fmt::format("printing a {} is not supported (Python shows an object address)", v.type_name()));
}

void append_repr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      append_string_repr(out, v.as_string());
      return;
    case Value::Kind::kUndefined:
      out += "Undefined";
      return;
    case Value::Kind::kSeq: {
      if (v.seq_kind() == SeqKind::kView || v.seq_kind() == SeqKind::kRange) throw_unprintable(v);
      const ValueList& items = v.as_seq();
      const bool tuple = v.is_tuple();
      out += tuple ? '(' : '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        append_repr(out, items[i]);
      }
      if (tuple && items.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Value::Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        append_string_repr(out, k);
        out += ": ";
        append_repr(out, item);
      }
      out += '}';
      return;
    }
    default:
      append_str(out, v);
  }
}

}  // namespace

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return;
    case Value::Kind::kNone:
      out += "None";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += python_float_repr(v.as_float());
      return;
    case Value::Kind::kString:
      out += v.as_string();
      return;
    case Value::Kind::kSeq:
    case Value::Kind::kDict:
      append_repr(out, v);
      return;
    default:
      throw_unprintable(v);
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  std::string out;
  append_str(out, v);
  return out;
}

std::string to_repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

namespace {

// Python's comparison of an int and a float, exactly (not through a rounded double).
int compare_int_float(int64_t i, double f) {
  if (f >= 9223372036854775808.0) return -1;
  if (f < -9223372036854775808.0) return 1;
  const double t = std::trunc(f);
  const auto ti = static_cast<int64_t>(t);
  if (i != ti) return i < ti ? -1 : 1;
  const double frac = f - t;
  return frac > 0 ? -1 : frac < 0 ? 1 : 0;
}

using Op = CompareOp;

bool apply(Op op, int c) {
  switch (op) {
    case Op::kLt:
      return c < 0;
    case Op::kLe:
      return c <= 0;
    case Op::kGt:
      return c > 0;
    case Op::kGe:
      return c >= 0;
  }
  return false;
}

bool compare_numbers(const Value& a, const Value& b, Op op) {
  if (a.is_integral() && b.is_integral()) {
    return apply(op, a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_float() && b.is_float()) {
    const double x = a.as_float();
    const double y = b.as_float();
    switch (op) {
      case Op::kLt:
        return x < y;
      case Op::kLe:
        return x <= y;
      case Op::kGt:
        return x > y;
      case Op::kGe:
        return x >= y;
    }
  }
  const double f = a.is_float() ? a.as_float() : b.as_float();
  if (std::isnan(f)) return false;
  const int c = a.is_float() ? -compare_int_float(b.as_int(), f) : compare_int_float(a.as_int(), f);
  return apply(op, c);
}

bool compare_impl(const Value& a, const Value& b, Op op, const char* symbol) {
  if (a.is_undefined() || b.is_undefined()) {
    throw TemplateError((a.is_undefined() ? a : b).undefined_hint());
  }
  if (a.is_number() && b.is_number()) return compare_numbers(a, b, op);
  if (a.is_string() && b.is_string()) return apply(op, a.as_string().compare(b.as_string()));
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const ValueList& x = a.as_seq();
    const ValueList& y = b.as_seq();
    const size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!equals(x[i], y[i])) return compare_impl(x[i], y[i], op, symbol);
    }
    return apply(op, x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0);
  }
  throw TemplateError(fmt::format("'{}' not supported between instances of '{}' and '{}'", symbol,
                                  a.type_name(), b.type_name()));
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    if (a.is_float() && b.is_float()) return a.as_float() == b.as_float();
    const double f = a.is_float() ? a.as_float() : b.as_float();
    if (std::isnan(f)) return false;
    return compare_int_float(a.is_float() ? b.as_int() : a.as_int(), f) == 0;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kSeq: {
      for (const Value* v : {&a, &b}) {
        if (v->seq_kind() == SeqKind::kView || v->seq_kind() == SeqKind::kRange) {
          throw TemplateError(fmt::format("comparing a {} is not supported", v->type_name()));
        }
      }
      if (a.seq_kind() != b.seq_kind()) return false;
      const ValueList& x = a.as_seq();
      const ValueList& y = b.as_seq();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.as_dict().items;
      const DictEntries& y = b.as_dict();
      if (x.size() != y.items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = y.find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

bool compare(const Value& a, const Value& b, CompareOp op) {
  static constexpr const char* kSymbols[] = {"<", "<=", ">", ">="};
  return compare_impl(a, b, op, kSymbols[static_cast<int>(op)]);
}

namespace {

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80) {
      size_t len;
      const char32_t cp = text::decode(s, i, len);
      if (ensure_ascii) {
        if (cp >= 0x10000) {
          const char32_t v = cp - 0x10000;
          out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
        } else {
          out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
        }
      } else {
        out.append(s, i, len);
      }
      i += len;
      continue;
    }
    switch (b) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (b < 0x20 || (ensure_ascii && b == 0x7f)) {
          out += fmt::format("\\u{:04x}", b);
        } else {
          out += static_cast<char>(b);
        }
    }
    ++i;
  }
  out += '"';
}

struct JsonWriter {
  const JsonDumpOptions& options;
  std::string item_separator;
  std::string key_separator;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += options.indent;
  }

  void write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat: {
        const double f = v.as_float();
        if (std::isnan(f)) {
          out += "NaN";
        } else if (std::isinf(f)) {
          out += f > 0 ? "Infinity" : "-Infinity";
        } else {
          out += python_float_repr(f);
        }
        return;
      }
      case Value::Kind::kString:
        append_json_string(out, v.as_string(), options.ensure_ascii);
        return;
      case Value::Kind::kSeq: {
        if (v.seq_kind() == SeqKind::kView || v.seq_kind() == SeqKind::kRange) break;
        const ValueList& items = v.as_seq();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        if (options.has_indent) newline(level + 1);
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) {
            out += item_separator;
            if (options.has_indent) newline(level + 1);
          }
          write(items[i], level + 1);
        }
        if (options.has_indent) newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        const auto& items = v.as_dict().items;
        if (items.empty()) {
          out += "{}";
          return;
        }
        std::vector<const std::pair<std::string, Value>*> order;
        for (const auto& item : items) order.push_back(&item);
        if (options.sort_keys) {
          std::stable_sort(order.begin(), order.end(), [](auto* x, auto* y) { return x->first < y->first; });
        }
        out += '{';
        if (options.has_indent) newline(level + 1);
        for (size_t i = 0; i < order.size(); ++i) {
          if (i > 0) {
            out += item_separator;
            if (options.has_indent) newline(level + 1);
          }
          append_json_string(out, order[i]->first, options.ensure_ascii);
          out += key_separator;
          write(order[i]->second, level + 1);
        }
        if (options.has_indent) newline(level);
        out += '}';
        return;
      }
      default:
        break;
    }
    throw TemplateError(fmt::format("Object of type {} is not JSON serializable", v.type_name()));
  }
};

template <typename Json>
Value convert_json(const Json& j, int depth) {
  if (depth > 512) throw TemplateError("JSON nested deeper than 512 levels");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw TemplateError(fmt::format("the integer {} is above the 64-bit range templates compute in", u));
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      if (!text::valid_utf8(s)) throw TemplateError("a JSON string is not valid UTF-8");
      return Value::string(s);
    }
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(convert_json(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DictEntries entries;
      entries.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!text::valid_utf8(it.key())) throw TemplateError("a JSON object key is not valid UTF-8");
        entries.items.emplace_back(it.key(), convert_json(it.value(), depth + 1));
      }
      return Value::dict(std::move(entries));
    }
    default:
      throw TemplateError("binary JSON values are not supported");
  }
}

}  // namespace

std::string python_json_dumps(const Value& v, const JsonDumpOptions& options) {
  JsonWriter w{options, options.item_separator, options.key_separator, {}};
  if (!options.has_separators) {
    w.item_separator = options.has_indent ? "," : ", ";
    w.key_separator = ": ";
  }
  w.write(v, 0);
  return std::move(w.out);
}

Value from_json(const nlohmann::ordered_json& j) {
  return convert_json(j, 0);
}
Value from_json(const nlohmann::json& j) {
  return convert_json(j, 0);
}

}  // namespace crescent::jinja
