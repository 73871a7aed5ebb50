// `crescent profile`: fits the cost model's coefficients to an executor's timed iterations (issue 11 §4) and
// writes a profile that simulate, experiment and serve take with --profile (or a config's "profile").
//   crescent profile --executor cpu --model DIR [--threads N] [--neighbour-core C] --out profile.json
//   crescent profile --executor mock [--config FILE] --out profile.json   (must give back the roofline's)
//   crescent profile --url http://HOST:PORT --served-model NAME [--api-key-file F] --out profile.json
//       (an OpenAI-compatible engine through its API, serve/http_profile_target.h; docs/cost-model.md)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "cli/commands.h"
#include "cluster/cluster_config.h"
#include "common/atomic_file.h"
#include "model/cpu_limits.h"
#include "model/profiler.h"
#include "serve/http_profile_target.h"

namespace crescent::cli {
namespace {

struct ProfileArgs {
  std::string executor = "cpu";
  std::string model_dir;
  std::string config_path;
  std::string out;
  int threads = 0;
  std::optional<int64_t> block_size;  // default: kExecutorBlockSize, or kEngineBlockSize with --url
  int repeats = 3;
  bool quick = false;
  std::optional<int> neighbour_core;
  // --url: an engine over HTTP.
  std::string url;
  std::string served_model;
  std::string api_key_file;
  int64_t vocab_size = 32000;
  double request_timeout_s = 120;
  std::optional<uint64_t> seed;  // default: drawn from std::random_device
};

constexpr int64_t kExecutorBlockSize = 64;
constexpr int64_t kEngineBlockSize = 16;  // vLLM's default block size

// The grid `args` asks for. An engine over HTTP gets a smaller one than an executor (every point is a few
// requests through the engine's queue, and an engine's TTFT is what the router needs, not its chunked
// iterations, which the API cannot show: no chunk sizes).
model::ProfileGrid grid_of(const ProfileArgs& args, int64_t block_size) {
  model::ProfileGrid grid;
  grid.repeats = args.repeats;
  if (!args.url.empty()) {
    grid.chunk_tokens = {};
    // Prefixes of whole blocks, whatever the engine's block size.
    const auto blocks_of = [&](int64_t tokens) {
      return (tokens + block_size - 1) / block_size * block_size;
    };
    if (args.quick) {  // ~10 s against an engine of a few ms per step
      grid.prefill_tokens = {64, 256, 512};
      grid.prefix_tokens = {0, blocks_of(512)};
      grid.decode_batch = {1, 2, 4};
      grid.decode_context = {64, 256};
    } else {
      grid.prefill_tokens = {128, 256, 512, 1024};
      grid.prefix_tokens = {0, blocks_of(512), blocks_of(1024)};
      grid.decode_batch = {1, 2, 4, 8};
      grid.decode_context = {128, 512};
    }
    return grid;
  }
  if (args.quick) {  // seconds, not minutes: for tests and a first look
    grid.prefill_tokens = {32, 64, 128};
    grid.prefix_tokens = {0, 4 * block_size};
    grid.decode_batch = {1, 2, 4};
    grid.decode_context = {64, 256};
    grid.chunked_prompt_tokens = 256;
    grid.chunk_tokens = {64, 128};
    grid.chunked_decode_batch = 2;
    grid.chunked_decode_context = 128;
  }
  return grid;
}

// --api-key-file's first line (a key given in a file stays out of the process list).
Result<std::string> api_key_of(const std::string& path) {
  if (path.empty()) return std::string();
  auto text = read_small_file(path);
  if (!text.ok()) return Status::invalid_argument(fmt::format("--api-key-file: {}", text.status().message()));
  std::string key = text->substr(0, text->find_first_of("\r\n"));
  if (key.empty())
    return Status::invalid_argument(fmt::format("--api-key-file {}: its first line is empty", path));
  return key;
}

void print_report(const model::ProfileReport& r, const perf::Profile* truth) {
  const perf::Profile& p = r.profile;
  fmt::print("{:<32} {:>14}{}\n", "coefficient", "fitted",
             truth ? fmt::format(" {:>14} {:>9}", "roofline", "error") : "");
  const auto row = [&](const char* name, double fitted, double expected) {
    std::string tail;
    if (truth) {
      tail = fmt::format(" {:>14.6g} {:>8.2f}%", expected,
                         expected > 0 ? 100 * (fitted - expected) / expected : 100 * fitted);
    }
    fmt::print("{:<32} {:>14.6g}{}\n", name, fitted, tail);
  };
  const perf::Profile zero;
  const perf::Profile& t = truth ? *truth : zero;
  row("linear_s_per_token", p.linear_s_per_token, t.linear_s_per_token);
  row("attention_s_per_token_context", p.attention_s_per_token_context, t.attention_s_per_token_context);
  row("decode_weight_read_s", p.decode_weight_read_s, t.decode_weight_read_s);
  row("decode_s_per_request", p.decode_s_per_request, t.decode_s_per_request);
  row("decode_kv_read_s_per_token", p.decode_kv_read_s_per_token, t.decode_kv_read_s_per_token);
  row("prefill_iteration_overhead_s", p.prefill_iteration_overhead_s, t.prefill_iteration_overhead_s);
  fmt::print("residuals (RMS, relative): prefill {:.1f}%, decode {:.1f}% over {} points\n",
             100 * r.prefill_rms_relative, 100 * r.decode_rms_relative, r.points.size());
  if (!r.chunked.empty()) {
    fmt::print(
        "\nchunked prefill beside a decode batch: the prompt whole (one iteration) vs in chunks, measured "
        "and "
        "as the fitted profile predicts\n");
    fmt::print("{:>7} {:>7} {:>10} {:>11} {:>12} {:>13} {:>15}\n", "chunk", "chunks", "whole s", "chunked s",
               "extra/chunk", "predicted s", "predicted extra");
    for (const model::ChunkedPrefill& m : r.chunked) {
      const double extra = (m.chunked_s - m.whole_s) / static_cast<double>(m.chunks - 1);
      const double predicted_extra =
          (m.predicted_chunked_s - m.predicted_whole_s) / static_cast<double>(m.chunks - 1);
      fmt::print("{:>7} {:>7} {:>10.4f} {:>11.4f} {:>12.5f} {:>13.4f} {:>15.5f}\n", m.chunk_tokens, m.chunks,
                 m.whole_s, m.chunked_s, extra, m.predicted_chunked_s, predicted_extra);
    }
  }
}

int run_profile(const ProfileArgs& args) {
  const bool over_http = !args.url.empty();
  if (!over_http && args.executor != "cpu" && args.executor != "mock") {
    return fail(
        Status::invalid_argument(fmt::format("--executor must be cpu or mock, got \"{}\"", args.executor)));
  }
  const int64_t block_size = args.block_size.value_or(over_http ? kEngineBlockSize : kExecutorBlockSize);
  if (block_size < 1) return fail(Status::invalid_argument("--block-size must be >= 1"));
  if (args.repeats < 1) return fail(Status::invalid_argument("--repeats must be >= 1"));
  if (args.neighbour_core && args.executor != "cpu") {
    return fail(
        Status::invalid_argument("--neighbour-core needs --executor cpu (the mock's time is the model's)"));
  }
  if (over_http && args.served_model.empty()) {
    return fail(Status::invalid_argument("--url needs --served-model NAME (a model GET /v1/models lists)"));
  }
  const model::ProfileGrid grid = grid_of(args, block_size);
  for (int64_t p : grid.prefix_tokens) {
    if (p % block_size != 0) {
      return fail(Status::invalid_argument(
          fmt::format("--block-size {} must divide the prefix sizes ({})", block_size, p)));
    }
  }
  const auto progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  Result<model::ProfileReport> report = Status::internal("not run");
  std::optional<perf::Profile> truth;
  if (over_http) {
    auto api_key = api_key_of(args.api_key_file);
    if (!api_key.ok()) return fail(api_key.status());
    // A seed of its own: a second run against the same engine must not find the first one's prompts cached.
    std::random_device device;
    const uint64_t seed = args.seed.value_or((uint64_t{device()} << 32) | device());
    progress(fmt::format("profile: {} (model {}), prompts from seed {}", args.url, args.served_model, seed));
    auto target = serve::http_profile_target({.url = args.url,
                                              .model = args.served_model,
                                              .api_key = *api_key,
                                              .block_size_tokens = block_size,
                                              .vocab_size = args.vocab_size,
                                              .timeout_s = args.request_timeout_s,
                                              .seed = seed});
    if (!target.ok()) return fail(target.status());
    report = model::profile_target(**target, grid,
                                   fmt::format("url: {} (model {})", args.url, args.served_model), progress);
  } else if (args.executor == "mock") {
    auto config = load_cluster_config_or_default(args.config_path, block_size);
    if (!config.ok()) return fail(config.status());
    config->profile.reset();  // the mock's own roofline is what must come back
    const perf::CostModel cost = cluster::cost_model(*config);
    truth = cost.coefficients();
    auto target = model::mock_profile_target(cost);
    report = model::profile_target(
        *target, grid, fmt::format("mock: {} on {}", config->model.name, config->hardware.name), progress);
  } else {
    if (args.model_dir.empty()) {
      return fail(Status::invalid_argument(
          "--executor cpu needs --model DIR (a directory `crescent model init` writes)"));
    }
    if (args.threads > 0) model::set_compute_threads(args.threads);
    auto loaded = model::load_llama_model(args.model_dir);
    if (!loaded.ok()) return fail(loaded.status());
    const int64_t longest =
        std::max(grid.chunked_prompt_tokens, *std::ranges::max_element(grid.prefill_tokens) +
                                                 *std::ranges::max_element(grid.prefix_tokens));
    const int64_t decode_tokens = *std::ranges::max_element(grid.decode_batch) *
                                  (*std::ranges::max_element(grid.decode_context) + block_size);
    if (longest + 1 > loaded->config.max_position_embeddings) {
      return fail(Status::invalid_argument(
          fmt::format("the grid's longest prompt ({} tokens) exceeds the model's context of {}", longest,
                      loaded->config.max_position_embeddings)));
    }
    model::LlamaForward forward(*loaded);
    std::string source = fmt::format("cpu: {} ({} thread{})", args.model_dir, model::compute_threads(),
                                     model::compute_threads() == 1 ? "" : "s");
    std::unique_ptr<model::ProfileNeighbour> neighbour;
    if (args.neighbour_core) {
      // The other role's typical iteration: a prefill chunk of the longest grid prompt, or a decode step
      // over the grid's middle context.
      auto made = model::cpu_profile_neighbour(*loaded, *args.neighbour_core, block_size,
                                               *std::ranges::max_element(grid.prefill_tokens),
                                               grid.decode_context[grid.decode_context.size() / 2]);
      if (!made.ok()) return fail(made.status());
      neighbour = std::move(*made);
      source += fmt::format(", beside the other role on core {}", *args.neighbour_core);
    }
    *loaded = model::LlamaModel{};
    const int64_t blocks = 2 * (longest + decode_tokens) / block_size + 64;
    auto target = model::cpu_profile_target(forward, block_size, blocks);
    report = model::profile_target(*target, grid, source, progress, neighbour.get());
    if (neighbour) {
      progress(fmt::format("profile: the neighbour on core {} ran {} iterations beside the timed ones",
                           *args.neighbour_core, neighbour->iterations()));
    }
  }
  if (!report.ok()) return fail(report.status());
  print_report(*report, truth ? &*truth : nullptr);
  if (Status s = write_file_atomically(args.out, dump_json(model::to_json(*report), 2) + "\n"); !s.ok())
    return fail(s);
  fmt::print("wrote {}\n", args.out);
  return 0;
}

}  // namespace

void register_profile(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand("profile",
                                     "Fit the cost model's coefficients to an executor's timed iterations "
                                     "(or, with --url, an engine's timed "
                                     "requests); write a profile for --profile");
  CLI::Option* executor = cmd->add_option("--executor", args->executor,
                                          "cpu (a model on this machine) or mock (the config's cost model)")
                              ->capture_default_str();
  CLI::Option* model = cmd->add_option("--model", args->model_dir, "With cpu: the model directory");
  CLI::Option* config = cmd->add_option("--config", args->config_path,
                                        "With mock: the cluster config whose cost model is profiled");
  cmd->add_option("--out", args->out, "Where to write the profile (JSON)")->required();
  CLI::Option* threads = cmd->add_option(
      "--threads", args->threads, "With cpu: compute threads (default: the cores this process may use)");
  cmd->add_option(
      "--block-size", args->block_size,
      fmt::format("KV block size, tokens; cached prefixes are multiples of it (default {}; with --url "
                  "{}, vLLM's: give the engine's)",
                  kExecutorBlockSize, kEngineBlockSize));
  cmd->add_option("--repeats", args->repeats, "Times each point is measured (the median counts)")
      ->capture_default_str();
  cmd->add_flag("--quick", args->quick, "A small grid (seconds): for tests and a first look");
  CLI::Option* neighbour =
      cmd->add_option("--neighbour-core", args->neighbour_core,
                      "With cpu: time each point while a second copy of the model computes the other role on "
                      "this core (prefill beside decode steps, decode beside prefill), as a prefill and a "
                      "decode instance sharing this host do");
  CLI::Option* url =
      cmd->add_option("--url", args->url,
                      "Instead of an executor: an OpenAI-compatible engine, http://HOST:PORT, timed through "
                      "its API (/v1/completions with token-id prompts; no chunked-prefill measurement)");
  url->excludes(executor)->excludes(model)->excludes(config)->excludes(threads)->excludes(neighbour);
  cmd->add_option("--served-model", args->served_model,
                  "With --url: the model to request (as /v1/models lists it)")
      ->needs(url);
  cmd->add_option("--api-key-file", args->api_key_file,
                  "With --url: a file whose first line is sent as \"Authorization: Bearer KEY\"")
      ->needs(url);
  cmd->add_option("--vocab-size", args->vocab_size,
                  "With --url: prompt token ids are drawn below this (the engine's vocabulary)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(url);
  cmd->add_option(
         "--seed", args->seed,
         "With --url: the seed of the prompts' random token ids (default: a new one each run, so that "
         "no prompt is in the engine's cache from an earlier run)")
      ->needs(url);
  cmd->add_option("--request-timeout", args->request_timeout_s,
                  "With --url: seconds each HTTP call may take (connecting at most 10 of them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(url);
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_profile(*args); }); });
}

}  // namespace crescent::cli
