// `crescent analyze TRACE...`: request statistics and prefix-reuse potential of Mooncake traces.
#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "common/json_util.h"
#include "common/status.h"
#include "common/text_format.h"
#include "model/llama.h"
#include "perf/model_spec.h"
#include "trace/reader.h"
#include "trace/stats.h"

namespace crescent::cli {
namespace {

struct AnalyzeArgs {
  std::vector<std::string> traces;
  int64_t block_size_tokens = 512;
  std::string capacities = "1M,3M,10M,50M,inf";
  bool skip_invalid = false;
  bool json = false;
  std::string model;  // a model preset or directory: capacities also in bytes of its KV
  bool keys_from_tokens = false;  // block keys from each line's token_ids at block_size_tokens
  int top_roots = 10;
  int64_t root_blocks = 1;  // a request's prefix root: the key ending its first root_blocks blocks
};

// A model's KV bytes per token, for capacities in bytes: `model` names a directory with a config.json
// (`crescent model init` writes one; Hugging Face's) or a preset of the cost model.
struct ModelKv {
  std::string name;
  int64_t bytes_per_token = 0;
};

Result<ModelKv> model_kv(const std::string& model) {
  if (std::filesystem::is_directory(model)) {
    Result<model::LlamaConfig> config = model::read_llama_config(model);
    if (!config.ok()) return config.status();
    return ModelKv{model, perf::kv_bytes_per_token(model::model_spec(*config, model))};
  }
  Result<perf::ModelSpec> spec = perf::model_preset(model);
  if (!spec.ok()) {
    return Status::invalid_argument(
        fmt::format("--model '{}': not a model directory, and {}", model, spec.status().message()));
  }
  return ModelKv{spec->name, perf::kv_bytes_per_token(*spec)};
}

// `tokens` of KV of `model` in GiB, as text ("n/a" without a model or capacity).
std::string gib(const std::optional<ModelKv>& model, std::optional<int64_t> tokens) {
  if (!model || !tokens) return "n/a";
  return fmt::format("{:.1f}", static_cast<double>(*tokens) * static_cast<double>(model->bytes_per_token) /
                                   static_cast<double>(1ll << 30));
}

std::string_view trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(' ');
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(' ') - begin + 1);
}

// One capacity: a token count >= 1 with an optional k/M/G suffix (x 10^3, 10^6, 10^9), or inf/unbounded.
Result<std::optional<int64_t>> parse_capacity(std::string_view text) {
  if (text == "inf" || text == "unbounded") return std::optional<int64_t>();
  auto bad = [&] {
    return Status::invalid_argument(fmt::format(
        "--capacities: bad value '{}': expected a token count >= 1 like 500000, 3M or inf", text));
  };
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return bad();
  const std::string_view suffix(end, static_cast<size_t>(text.data() + text.size() - end));
  int64_t multiplier = 1;
  if (suffix == "k" || suffix == "K") {
    multiplier = 1'000;
  } else if (suffix == "M") {
    multiplier = 1'000'000;
  } else if (suffix == "G") {
    multiplier = 1'000'000'000;
  } else if (!suffix.empty()) {
    return bad();
  }
  if (value < 1 || value > std::numeric_limits<int64_t>::max() / multiplier) return bad();
  return std::optional<int64_t>(value * multiplier);
}

// A comma-separated list of parse_capacity() values.
Result<std::vector<std::optional<int64_t>>> parse_capacities(std::string_view list) {
  std::vector<std::optional<int64_t>> capacities;
  for (;;) {
    const size_t comma = list.find(',');
    Result<std::optional<int64_t>> capacity = parse_capacity(trim(list.substr(0, comma)));
    if (!capacity.ok()) return capacity.status();
    capacities.push_back(*capacity);
    if (comma == std::string_view::npos) return capacities;
    list.remove_prefix(comma + 1);
  }
}

// A ratio as a percentage; "n/a" for a ratio of nothing.
std::string percent(std::optional<double> ratio) {
  return format_or_na(ratio, 100, 2, "%");
}

// `tokens` as a share of `whole` tokens; none when `whole` is 0.
std::optional<double> share_of(double tokens, double whole) {
  return whole > 0 ? std::optional<double>(tokens / whole) : std::nullopt;
}

// Where the reuse comes from: the top prefix roots, and within vs across sessions.
void print_reuse_sources(const trace::TraceStats& stats, int64_t root_blocks) {
  double top_share = 0;
  for (const trace::PrefixRoot& root : stats.top_roots) top_share += root.reused_share;
  fmt::print("\n  prefix roots    {} ({}), {} with reused tokens", stats.distinct_roots,
             root_blocks == 1 ? "first blocks" : fmt::format("prefixes of {} blocks", root_blocks),
             stats.roots_with_reuse);
  if (!stats.top_roots.empty()) {
    fmt::print("; the top {} hold {} of reused tokens", stats.top_roots.size(), percent(top_share));
  }
  fmt::print("\n");
  if (!stats.top_roots.empty()) {
    fmt::print("  {:>21}  {:>8}  {:>13}  {:>14}  {:>13}  {:>15}  {:>11}\n", "root key", "requests",
               "reused tokens", "share of reuse", "common blocks", "reuse in common", "deepest hit");
    for (const trace::PrefixRoot& root : stats.top_roots) {
      fmt::print("  {:>21}  {:>8}  {:>13.0f}  {:>14}  {:>13}  {:>15}  {:>11}\n", root.key, root.requests,
                 root.reused_tokens, percent(root.reused_share), root.common_blocks,
                 percent(share_of(root.common_reused_tokens, root.reused_tokens)),
                 fmt::format("{} blocks", root.deepest_hit_blocks));
    }
  }
  if (!stats.sessions) {
    fmt::print("\n  sessions        no sessions in this trace\n");
    return;
  }
  const trace::SessionReuse& sessions = *stats.sessions;
  fmt::print("\n  sessions        {}, on {} of {} requests\n", sessions.sessions,
             sessions.requests_with_session, stats.requests);
  fmt::print("  {:<23}  {:>9} of input tokens  {:>9} of reused tokens\n", "reused within a session",
             percent(sessions.within_input_share), percent(sessions.within_reused_share));
  fmt::print("  {:<23}  {:>9} of input tokens  {:>9} of reused tokens\n", "reused across sessions",
             percent(sessions.across_input_share), percent(sessions.across_reused_share));
  if (sessions.unattributed_tokens > 0) {
    fmt::print(
        "  {:<23}  {:>9} of input tokens  {:>9} of reused tokens (request or block without a session)\n",
        "reused, unattributed", percent(sessions.unattributed_input_share),
        percent(sessions.unattributed_reused_share));
  }
}

void print_text(const std::string& path, const trace::TraceStats& stats, const AnalyzeArgs& args,
                const std::optional<ModelKv>& model) {
  fmt::print("{}\n", path);
  fmt::print("  requests        {}\n", stats.requests);
  fmt::print("  span            {:.3f} s\n", stats.span_s);
  fmt::print("  arrival rate    {}\n", stats.arrival_rate_per_s
                                           ? fmt::format("{:.3f} req/s", *stats.arrival_rate_per_s)
                                           : "n/a (all requests arrive at once)");
  auto print_length = [](std::string_view name, const std::optional<trace::LengthStats>& length) {
    if (!length) {
      fmt::print("  {:<14}  n/a\n", name);
      return;
    }
    fmt::print("  {:<14}  mean {:.1f}, p50 {}, p99 {}\n", name, length->mean, length->p50, length->p99);
  };
  print_length("input tokens", stats.input_tokens);
  print_length("output tokens", stats.output_tokens);
  fmt::print("  reuse ceiling   {} of input tokens (unbounded cache, {}-token blocks{})\n",
             percent(stats.reuse_ceiling), args.block_size_tokens,
             args.keys_from_tokens ? ", keys from token ids" : "");
  if (model) fmt::print("  KV of {}   {} bytes per token\n", model->name, model->bytes_per_token);
  // The KV column only with a model: "  " + 8 characters wide.
  auto kv_column = [&](const std::string& text) { return model ? fmt::format("  {:>8}", text) : ""; };
  fmt::print("\n  {:>21}{}  {:>9}  {:>16}  {:>13}\n", "LRU capacity (tokens)", kv_column("KV (GiB)"),
             "hit ratio", "share of ceiling", "optimal (MIN)");
  for (const trace::CapacityHitRatio& point : stats.hit_ratio_by_capacity) {
    const std::string capacity = point.capacity_tokens ? std::to_string(*point.capacity_tokens) : "unbounded";
    std::optional<double> share;  // of a zero ceiling: nothing to share
    if (point.hit_ratio && stats.reuse_ceiling && *stats.reuse_ceiling > 0) {
      share = *point.hit_ratio / *stats.reuse_ceiling;
    }
    fmt::print("  {:>21}{}  {:>9}  {:>16}  {:>13}\n", capacity, kv_column(gib(model, point.capacity_tokens)),
               percent(point.hit_ratio), percent(share), percent(point.optimal_hit_ratio));
  }
  fmt::print("\n  {:>21}  {:>10}  {:>17}\n", "hottest block key", "references", "share of requests");
  for (const trace::HotBlock& block : stats.hottest_blocks) {
    fmt::print("  {:>21}  {:>10}  {:>17}\n", block.key, block.references, percent(block.request_share));
  }
  print_reuse_sources(stats, args.root_blocks);
}

// A token count the analyzer sums in a double (exact far beyond any trace) as a JSON integer.
nlohmann::ordered_json json_tokens(double tokens) {
  return static_cast<int64_t>(tokens);
}

nlohmann::ordered_json to_json(const std::string& path, const trace::TraceStats& stats,
                               const AnalyzeArgs& args, int64_t skipped_lines,
                               const std::optional<ModelKv>& model) {
  nlohmann::ordered_json hit_ratios = nlohmann::ordered_json::array();
  for (const trace::CapacityHitRatio& point : stats.hit_ratio_by_capacity) {
    hit_ratios.push_back(
        {{"capacity_tokens", point.capacity_tokens ? nlohmann::ordered_json(*point.capacity_tokens)
                                                   : nlohmann::ordered_json(nullptr)},
         {"capacity_bytes", model && point.capacity_tokens
                                ? nlohmann::ordered_json(*point.capacity_tokens * model->bytes_per_token)
                                : nlohmann::ordered_json(nullptr)},
         {"hit_ratio", json_or_null(point.hit_ratio)},
         {"optimal_hit_ratio", json_or_null(point.optimal_hit_ratio)}});
  }
  nlohmann::ordered_json hottest = nlohmann::ordered_json::array();
  for (const trace::HotBlock& block : stats.hottest_blocks) {
    hottest.push_back(
        {{"block_key", block.key}, {"references", block.references}, {"request_share", block.request_share}});
  }
  nlohmann::ordered_json roots = nlohmann::ordered_json::array();
  for (const trace::PrefixRoot& root : stats.top_roots) {
    roots.push_back({{"root_key", root.key},
                     {"requests", root.requests},
                     {"reused_tokens", json_tokens(root.reused_tokens)},
                     {"reused_share", root.reused_share},
                     {"common_blocks", root.common_blocks},
                     {"common_reused_tokens", json_tokens(root.common_reused_tokens)},
                     {"deepest_hit_blocks", root.deepest_hit_blocks}});
  }
  nlohmann::ordered_json sessions = nullptr;
  if (stats.sessions) {
    const trace::SessionReuse& s = *stats.sessions;
    sessions = {{"sessions", s.sessions},
                {"requests_with_session", s.requests_with_session},
                {"within_session_tokens", json_tokens(s.within_tokens)},
                {"across_sessions_tokens", json_tokens(s.across_tokens)},
                {"unattributed_tokens", json_tokens(s.unattributed_tokens)},
                {"within_session_input_share", json_or_null(s.within_input_share)},
                {"across_sessions_input_share", json_or_null(s.across_input_share)},
                {"within_session_reused_share", json_or_null(s.within_reused_share)},
                {"across_sessions_reused_share", json_or_null(s.across_reused_share)},
                {"unattributed_input_share", json_or_null(s.unattributed_input_share)},
                {"unattributed_reused_share", json_or_null(s.unattributed_reused_share)}};
  }
  // Lengths are known whenever the trace has requests (an empty trace is refused before this).
  const trace::LengthStats in = stats.input_tokens.value_or(trace::LengthStats{});
  const trace::LengthStats out = stats.output_tokens.value_or(trace::LengthStats{});
  return {{"trace", path},
          {"requests", stats.requests},
          {"span_s", stats.span_s},
          {"arrival_rate_per_s", json_or_null(stats.arrival_rate_per_s)},
          {"input_tokens_mean", in.mean},
          {"input_tokens_p50", in.p50},
          {"input_tokens_p99", in.p99},
          {"output_tokens_mean", out.mean},
          {"output_tokens_p50", out.p50},
          {"output_tokens_p99", out.p99},
          {"kv_bytes_per_token", model ? nlohmann::ordered_json(model->bytes_per_token) : nullptr},
          {"block_size_tokens", args.block_size_tokens},
          {"keys_from_token_ids", args.keys_from_tokens},
          {"reuse_ceiling", json_or_null(stats.reuse_ceiling)},
          {"reused_tokens", json_tokens(stats.reused_tokens)},
          {"hit_ratio_by_capacity", std::move(hit_ratios)},
          {"hottest_blocks", std::move(hottest)},
          {"root_blocks", args.root_blocks},
          {"distinct_roots", stats.distinct_roots},
          {"roots_with_reuse", stats.roots_with_reuse},
          {"top_roots", std::move(roots)},
          {"sessions", std::move(sessions)},
          {"skipped_lines", skipped_lines}};
}

// Analyzes one trace and prints its report.
Status analyze(const std::string& path, const AnalyzeArgs& args, const trace::AnalyzerOptions& options,
               const std::optional<ModelKv>& model) {
  Result<std::unique_ptr<trace::TraceReader>> reader =
      trace::TraceReader::open(path, {.block_size_tokens = args.block_size_tokens,
                                      .skip_invalid = args.skip_invalid,
                                      .keys_from_token_ids = args.keys_from_tokens});
  if (!reader.ok()) return reader.status();
  trace::TraceAnalyzer analyzer(options);
  trace::Request request;
  for (;;) {
    Result<bool> read = (*reader)->next(request);
    if (!read.ok()) return read.status();
    if (!*read) break;
    analyzer.add(request);
  }
  const trace::SkipReport& skipped = (*reader)->skipped();
  if (skipped.total_lines > 0) fmt::print(stderr, "{}\n", skipped.summary());
  const trace::TraceStats stats = analyzer.finish();
  if (stats.requests == 0) return trace::empty_trace_error(path, skipped);
  if (args.json) {
    fmt::print("{}\n", dump_json(to_json(path, stats, args, skipped.total_lines, model)));
  } else {
    print_text(path, stats, args, model);
  }
  return Status::ok_status();
}

// Runs the command; returns the exit code. Every error here comes from the input (flags or trace files).
int run(const AnalyzeArgs& args) {
  if (args.block_size_tokens < 1) {
    return fail(
        Status::invalid_argument(fmt::format("--block-size must be >= 1, got {}", args.block_size_tokens)));
  }
  if (args.top_roots < 0) {
    return fail(Status::invalid_argument(fmt::format("--top-roots must be >= 0, got {}", args.top_roots)));
  }
  if (args.root_blocks < 1) {
    return fail(
        Status::invalid_argument(fmt::format("--root-blocks must be >= 1, got {}", args.root_blocks)));
  }
  Result<std::vector<std::optional<int64_t>>> capacities = parse_capacities(args.capacities);
  if (!capacities.ok()) return fail(capacities.status());
  const trace::AnalyzerOptions options{.block_size_tokens = args.block_size_tokens,
                                       .capacities_tokens = std::move(*capacities),
                                       .top_roots = args.top_roots,
                                       .root_blocks = args.root_blocks};
  std::optional<ModelKv> model;
  if (!args.model.empty()) {
    Result<ModelKv> kv = model_kv(args.model);
    if (!kv.ok()) return fail(kv.status());
    model = *kv;
  }
  for (size_t i = 0; i < args.traces.size(); ++i) {
    if (i > 0 && !args.json) fmt::print("\n");
    if (Status status = analyze(args.traces[i], args, options, model); !status.ok()) {
      return fail(with_bundled_trace_hint(status, args.traces[i]));
    }
  }
  return 0;
}

}  // namespace

void register_analyze(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<AnalyzeArgs>();
  CLI::App* command = app.add_subcommand(
      "analyze",
      "Statistics and prefix-cache reuse potential (hit ratio vs capacity: LRU and optimal) of Mooncake traces");
  command->add_option("traces", args->traces, "Mooncake JSONL traces (.jsonl or .jsonl.gz)")->required();
  command
      ->add_option(
          "--block-size", args->block_size_tokens,
          "Tokens per block (>= 1): what one hash_ids entry stands for, or with --keys-from-tokens the "
          "block size to re-key the prompts at")
      ->capture_default_str();
  command->add_flag(
      "--keys-from-tokens", args->keys_from_tokens,
      "Compute block keys from each line's token_ids (a trace from `crescent trace import "
      "--keep-tokens`) at --block-size instead of using hash_ids, e.g. to see reuse at 16 or 64 "
      "tokens a block");
  command
      ->add_option("--top-roots", args->top_roots,
                   "How many prefix roots (first blocks) to list, most reused tokens first")
      ->capture_default_str();
  command
      ->add_option("--root-blocks", args->root_blocks,
                   "A request's prefix root is the prefix of its first N blocks (>= 1; its whole prompt when "
                   "shorter): more than 1 when every request starts with the same block")
      ->capture_default_str();
  command
      ->add_option("--capacities", args->capacities,
                   "Comma-separated LRU cache capacities in tokens; suffixes k/M/G, 'inf' or 'unbounded'")
      ->capture_default_str();
  command->add_flag("--skip-invalid", args->skip_invalid,
                    "Skip invalid lines (summary on stderr) instead of failing");
  command->add_flag("--json", args->json, "One JSON object per trace per line");
  command->add_option("--model", args->model,
                      "Also give capacities in GiB of this model's KV: a preset (llama3-70b) or a model directory");
  command->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run(*args); }); });
}

}  // namespace crescent::cli
