// The template lexer (internal to the jinja component): jinja2's lexer.py, rule for rule, with its
// default delimiters ({{ }}, {% %}, {# #}), no line statements, keep_trailing_newline off, and
// trim_blocks / lstrip_blocks as options. Whitespace control ("-" strips all whitespace, "+" keeps what
// trim_blocks / lstrip_blocks would remove), {% raw %}, comments, and the literal forms of jinja2's tag
// rules (ints with _ and 0b/0o/0x, floats, strings with Python's escapes) behave as there.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crescent::jinja {

struct Token {
  enum class Type : uint8_t {
    kData,
    kVariableBegin,
    kVariableEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInteger,
    kFloat,
    kOperator,  // `text` is the operator: "+", "//", "==", "(", ...
    kEof,
  };
  Type type = Type::kEof;
  std::string text;  // data, name, decoded string, or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

struct LexerOptions {
  bool trim_blocks = true;    // remove the first newline after a block tag (%})
  bool lstrip_blocks = true;  // strip spaces and tabs from a line's start up to a block tag or comment
};

/// The tokens of `source`, ending with kEof. Throws TemplateError (with the line) on a lexical error: an
/// unterminated comment, raw block or string, an unexpected character, unbalanced brackets, a string escape
/// Python rejects or that makes a lone surrogate, `\N{...}` escapes, non-ASCII characters outside strings
/// (jinja2 would take some as identifiers; not supported here).
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

}  // namespace crescent::jinja
