// Which variable each name of a template means (internal to the jinja component): jinja2 decides it at
// compile time (idtracking.py and the code generator's frames), and its answers are not those of a scope
// chain looked up at run time. A for loop's body is a new frame entered afresh each iteration, starting from
// the enclosing values; a name assigned in a frame is that frame's own from the frame's start (undefined,
// or an alias of the enclosing one, until assigned); a name assigned in only some branches of an `if`
// starts from the enclosing value. This pass ports those rules: every frame gets jinja2's load
// instructions, every name the variable slot jinja2's generated code would read or write.
#pragma once

#include "jinja/ast.h"

namespace crescent::jinja {

/// Resolves the names of `program` and fills its frames. Throws TemplateError for what jinja2 refuses at
/// compile time (assigning `loop` inside a for loop, a name no frame knows), and for a loop filter that
/// reads a namespace the loop body assigns to (jinja2 filters lazily, between iterations; crescent filters
/// first).
void analyze_scopes(Program& program);

}  // namespace crescent::jinja
