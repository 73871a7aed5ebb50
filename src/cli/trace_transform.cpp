// `crescent trace transform IN... --out OUT [ops]` (issue 23 §4): what-if traces for planning. Flags are
// parsed here; the transforms are trace/transform.h, and docs/traces.md says what each keeps and cannot know.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "common/status.h"
#include "trace/transform.h"
#include "trace/writer.h"

namespace crescent::cli {
namespace {

// Factors (rate and length scales) are kept in a range where every trace stays representable.
constexpr double kMinFactor = 1e-6;
constexpr double kMaxFactor = 1e6;
// Each copy but the first reads the input twice at once (its sessions that wrap and those that do not): 2N -
// 1 open readers of about 0.25 MB each, per input.
constexpr int64_t kMaxCopies = 256;

struct TransformArgs {
  std::vector<std::string> inputs;
  std::string out;
  int64_t block_size_tokens = 512;
  std::string window;
  std::string rate_scale;
  int64_t copies = 1;
  std::string shared_min;
  std::string length_scale;
  std::string output_scale;
  bool shared_keys = false;
  bool absolute_time = false;
  bool dense_ids = false;
};

Status bad(std::string message) {
  return Status::invalid_argument(std::move(message));
}

// A decimal number, the whole of `text`.
std::optional<double> parse_number(std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

Result<double> parse_factor(std::string_view flag, const std::string& text) {
  std::optional<double> value = parse_number(text);
  if (!value || *value < kMinFactor || *value > kMaxFactor) {
    return bad(fmt::format("{} '{}': expected a number in [{:g}, {:g}], e.g. 2 or 0.5", flag, text,
                           kMinFactor, kMaxFactor));
  }
  return *value;
}

// "START:END" in seconds; either side may be empty (from the start, to the end).
Result<trace::TimeWindow> parse_window(const std::string& text) {
  const size_t colon = text.find(':');
  auto side = [&](std::string_view part, std::string_view which) -> Result<std::optional<int64_t>> {
    if (part.empty()) return std::optional<int64_t>();
    std::optional<double> seconds = parse_number(part);
    if (!seconds || *seconds < 0 || *seconds > 1e12) {
      return bad(fmt::format("--window '{}': {} '{}' is not a number of seconds >= 0", text, which, part));
    }
    return std::optional<int64_t>(std::llround(*seconds * 1000));
  };
  if (colon == std::string::npos) {
    return bad(fmt::format(
        "--window '{}': expected START_S:END_S (seconds; either may be empty), e.g. 600:1200", text));
  }
  Result<std::optional<int64_t>> start = side(std::string_view(text).substr(0, colon), "START");
  if (!start.ok()) return start.status();
  Result<std::optional<int64_t>> end = side(std::string_view(text).substr(colon + 1), "END");
  if (!end.ok()) return end.status();
  trace::TimeWindow window{.start_ms = start->value_or(0), .end_ms = *end};
  if (window.end_ms && *window.end_ms <= window.start_ms) {
    return bad(fmt::format("--window '{}': END must be after START", text));
  }
  return window;
}

// "K" (sessions) or "P%" (of all sessions).
Result<trace::SharedThreshold> parse_shared_min(const std::string& text) {
  if (text.ends_with('%')) {
    std::optional<double> percent = parse_number(std::string_view(text).substr(0, text.size() - 1));
    if (!percent || *percent <= 0 || *percent > 100) {
      return bad(fmt::format("--shared-min '{}': a percentage must be in (0, 100], e.g. 1%", text));
    }
    return trace::SharedThreshold{.min_percent = *percent};
  }
  int64_t sessions = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), sessions);
  if (error != std::errc() || end != text.data() + text.size() || text.empty() || sessions < 1) {
    return bad(
        fmt::format("--shared-min '{}': expected a number of sessions >= 1 (e.g. 2) or a percentage of "
                    "them (e.g. 1%)",
                    text));
  }
  return trace::SharedThreshold{.min_sessions = sessions};
}

Result<trace::TransformOptions> make_options(const TransformArgs& args) {
  trace::TransformOptions options;
  if (args.block_size_tokens < 1) {
    return bad(fmt::format("--block-size must be >= 1, got {}", args.block_size_tokens));
  }
  options.merge = {.block_size_tokens = args.block_size_tokens,
                   .shared_keys = args.shared_keys,
                   .absolute_time = args.absolute_time};
  if (!args.window.empty()) {
    Result<trace::TimeWindow> window = parse_window(args.window);
    if (!window.ok()) return window.status();
    options.window = *window;
  }
  if (args.copies < 1 || args.copies > kMaxCopies) {
    return bad(fmt::format("--copies must be in [1, {}], got {}", kMaxCopies, args.copies));
  }
  options.copies = args.copies;
  if (!args.shared_min.empty()) {
    if (args.copies == 1)
      return bad("--shared-min decides what --copies share: give --copies N (N >= 2) too");
    Result<trace::SharedThreshold> shared = parse_shared_min(args.shared_min);
    if (!shared.ok()) return shared.status();
    options.shared = *shared;
  }
  if (!args.length_scale.empty()) {
    Result<double> scale = parse_factor("--length-scale", args.length_scale);
    if (!scale.ok()) return scale.status();
    options.length = {.input = *scale, .output = *scale};
  }
  if (!args.output_scale.empty()) {
    Result<double> scale = parse_factor("--output-scale", args.output_scale);
    if (!scale.ok()) return scale.status();
    options.length.output = *scale;
  }
  if (!args.rate_scale.empty()) {
    Result<double> scale = parse_factor("--rate-scale", args.rate_scale);
    if (!scale.ok()) return scale.status();
    options.rate_scale = *scale;
  }
  options.dense_ids = args.dense_ids;
  return options;
}

int run(const TransformArgs& args) {
  Result<trace::TransformOptions> options = make_options(args);
  if (!options.ok()) return fail(options.status());
  if (args.out.ends_with(".gz")) {
    return fail(
        bad(fmt::format("--out '{}': gzip output is not written; write plain JSONL (e.g. --out - | gzip > "
                        "{})",
                        args.out, args.out)));
  }
  Result<std::unique_ptr<trace::TraceWriter>> writer = trace::TraceWriter::open(args.out);
  if (!writer.ok()) return fail(writer.status());
  Result<trace::TransformReport> report = trace::transform_trace(args.inputs, *options, **writer);
  if (!report.ok()) {
    Status status = report.status();
    if (status.code() == StatusCode::kNotFound) {
      for (const std::string& input : args.inputs) {
        if (!std::filesystem::exists(input)) {
          status = with_bundled_trace_hint(status, input);
          break;
        }
      }
    }
    return fail(status);
  }
  if (Status status = (*writer)->commit(); !status.ok()) return fail(status);
  std::string copies;
  if (report->copies) {
    const trace::CopySummary& c = *report->copies;
    copies = fmt::format(
        " ({} copies of {} requests; {} of {} block keys shared by >= {} of {} {}; offsets spread over "
        "{:.3f} s)",
        args.copies, report->requests_in, c.shared_keys, c.distinct_keys, c.min_sessions, c.sessions,
        c.by_session_ids ? "sessions" : "requests (no session ids)",
        static_cast<double>(c.period_ms) / 1000.0);
  }
  fmt::print(stderr, "wrote {} requests over {:.3f} s to {}{}\n", report->requests_out, report->span_s,
             args.out == "-" ? "standard output" : args.out, copies);
  return 0;
}

constexpr std::string_view kFooter = R"(
Steps, in this order (each only when its flag is given):
  1. merge      the inputs in arrival order, each starting at time 0 (--absolute-time: from the earliest
                first arrival); keys of input i > 0 derived apart unless --shared-keys; session id s of input
                i becomes s x inputs + i
  2. --window   keep arrivals in [START, END) seconds of the merged time; START becomes 0
  3. --copies   N copies of every session (more users): blocks of >= --shared-min sessions (default 2 with
                session ids; without, 1% of the requests and at least 2) keep their keys, each copy's own
                blocks get keys of its own; copy c starts c x P / N later (P: the window's length, or the
                last arrival), sessions that would start past P wrap to the front whole; session id s
                becomes s x N + c
  4. --length-scale, --output-scale   prompt (and output) lengths x X; each new block's key derived from the
                old block its prefix ends in, so shared prefixes stay shared in proportion
  5. --rate-scale   arrival times / X (X times the rate)
  6. --dense-ids    block keys renumbered 0, 1, 2, ... in first-seen order (else 64-bit keys)
The output is a valid trace for analyze and simulate at the same --block-size. What each step keeps and
cannot know: docs/traces.md.)";

}  // namespace

void register_trace_transform(CLI::App& trace_cmd, int& exit_code) {
  auto args = std::make_shared<TransformArgs>();
  CLI::App* cmd = trace_cmd.add_subcommand(
      "transform",
      "What-if traces for planning: a time window, a rate scale, more users, length scaling, merges");
  cmd->add_option("inputs", args->inputs, "Mooncake traces (.jsonl or .jsonl.gz); several are merged")
      ->required();
  cmd->add_option("--out", args->out, "The trace to write (plain JSONL; '-': standard output)")->required();
  cmd->add_option("--block-size", args->block_size_tokens,
                  "Tokens per hash_ids block of the inputs and output")
      ->capture_default_str();
  cmd->add_option("--window", args->window,
                  "START_S:END_S: keep arrivals in [START, END) seconds from the first, rebased to 0 (either "
                  "side may be empty)");
  cmd->add_option("--copies", args->copies, "N copies of every session: N times the users (1..256)")
      ->capture_default_str();
  cmd->add_option(
      "--shared-min", args->shared_min,
      "With --copies: blocks of at least K sessions (K) or P% of them (P%) stay shared by the copies");
  cmd->add_option("--length-scale", args->length_scale, "Multiply prompt and output lengths by X");
  cmd->add_option("--output-scale", args->output_scale,
                  "Multiply output lengths by X (overrides --length-scale for outputs)");
  cmd->add_option("--rate-scale", args->rate_scale, "Divide arrival times by X: X times the arrival rate");
  cmd->add_flag(
      "--shared-keys", args->shared_keys,
      "Merging: the inputs were keyed alike (same tokenizer and salt), so equal keys are one prefix");
  cmd->add_flag(
      "--absolute-time", args->absolute_time,
      "Merging: the inputs' timestamps share an epoch (keep their offsets instead of starting each at 0)");
  cmd->add_flag("--dense-ids", args->dense_ids,
                "Renumber block keys 0, 1, 2, ... in first-seen order (memory: one entry per distinct key)");
  cmd->footer(std::string(kFooter));
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run(*args); }); });
}

}  // namespace crescent::cli
