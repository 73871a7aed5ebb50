// The template parser (internal to the jinja component): jinja2's parser.py for the supported subset,
// tokens to a Program, then the scope analysis (scope.h). Everything outside the subset is refused here,
// by name and line, before any render: macro, call, filter blocks, include, import, extends, block,
// autoescape, recursive loops, unknown tags, unknown or unsupported filters and tests, *args/**kwargs.
#pragma once

#include <memory>
#include <string_view>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace crescent::jinja {

struct ParserLimits {
  int max_depth = 100;       // nesting of statements and of brackets in expressions
  int max_expr_depth = 400;  // depth of an expression's tree (operator, attribute and filter chains)
};

/// Parses `source`. Throws TemplateError (with its line) naming what is wrong or not supported.
std::unique_ptr<Program> parse_program(std::string_view source, const LexerOptions& lexer_options,
                                       const ParserLimits& limits);

}  // namespace crescent::jinja
