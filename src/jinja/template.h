// Jinja templates as Hugging Face renders chat templates (issue 23 §2): jinja2's language and semantics,
// in the environment transformers' apply_chat_template builds (ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension; a tojson filter that is json.dumps without HTML
// escaping; raise_exception and strftime_now globals; the {% generation %} tag). Checked byte for byte
// against Debian's python3-jinja2 (tests/jinja/). The language is the subset chat templates use and what
// sits beside it (docs/serving.md lists it); anything else (macros, includes, an unknown filter or test, a
// Python method not implemented, ...) is an error naming it, never a different rendering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent::jinja {

struct Program;

/// How a template is read (Hugging Face's settings are the defaults) and how far it may nest.
struct ParseOptions {
  bool trim_blocks = true;    // the first newline after a block tag is removed
  bool lstrip_blocks = true;  // spaces and tabs before a block tag or comment on its line are removed
  int max_depth = 100;        // nesting of statements and brackets; deeper is an error (no stack overflow)
  int max_expr_depth = 400;   // depth of one expression's tree (operator, attribute and filter chains)
  size_t max_source_bytes = 1 << 20;  // a longer template is refused
};

/// Bounds on one render: past any of them the render fails with an error naming it, so a hostile template
/// or input cannot exhaust memory or time.
struct RenderLimits {
  size_t max_output_bytes = 64 << 20;  // the rendered text, and any string the template builds
  size_t max_items = 1 << 20;          // any list the template builds
  uint64_t max_steps = 20'000'000;     // statements run, loop iterations, items filters process
};

/// A parsed template. Immutable: render() may run on several threads at once.
class Template {
 public:
  /// Parses `source` (UTF-8). Errors (kInvalidArgument) name the line and what is wrong or not supported:
  /// "line 3: 'macro' is not supported (macros)", "line 1: No filter named 'foo'.".
  static Result<Template> parse(std::string_view source, const ParseOptions& options = {});

  /// Renders with `variables` (a JSON object: name -> value) as jinja2's render(**variables) does; objects
  /// keep their key order (ordered_json) or come sorted (json), which tojson and dict iteration show.
  /// Errors (kInvalidArgument) name the line: an exception the template raised (raise_exception's message),
  /// an undefined value misused ("'dict object' has no attribute 'content'"), a construct or value not
  /// supported, a limit passed. `variables` not an object is an error.
  Result<std::string> render(const nlohmann::ordered_json& variables, const RenderLimits& limits = {}) const;
  Result<std::string> render(const nlohmann::json& variables, const RenderLimits& limits = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  template <typename Json>
  Result<std::string> render_json(const Json& variables, const RenderLimits& limits) const;

  std::shared_ptr<const Program> program_;
};

}  // namespace crescent::jinja
