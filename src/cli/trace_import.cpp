// `crescent trace import`: request logs -> a Mooncake-format trace (issue 23 §3; docs/traces.md).
//   crescent trace import --format openai-log|sharegpt|csv [--model DIR | --tokenizer FILE] --out TRACE
//   LOG...
// Tokens from the model's tokenizer and chat template; block keys by the project's chained hash from a secret
// salt (--salt-file, else a random one), renumbered densely unless --raw-keys; a summary on stderr and, on a
// terminal, a progress bar. Exit 2 on bad input (file:line and the field), nothing written.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/prompt_tokenizer.h"
#include "common/atomic_file.h"
#include "common/secret.h"
#include "common/status_line.h"
#include "common/text_format.h"
#include "trace/import.h"
#include "trace/log_import.h"
#include "trace/writer.h"

namespace crescent::cli {
namespace {

struct ImportArgs {
  std::vector<std::string> logs;
  std::string format = "openai-log";
  std::string model_dir;
  std::string tokenizer_file;
  std::string out;
  int64_t block_size_tokens = 512;
  std::string salt_file;
  bool raw_keys = false;
  bool keep_tokens = false;
  bool skip_invalid = false;
  int64_t default_output_tokens = 256;
  double reorder_window_s = 300;
  double session_rate_per_s = 1.0;
  double think_time_s = 30;
  uint64_t seed = 1;
  std::string columns = "azure";
};

// The salt: the file's bytes without trailing white space, or 32 random bytes nobody keeps.
Result<std::string> load_salt(const std::string& file) {
  if (file.empty()) {
    const auto bytes = ClusterSecret::generate().derive("trace-import-salt");
    return std::string(bytes.begin(), bytes.end());
  }
  Result<std::string> salt = read_small_file(file);
  if (!salt.ok()) return Status::invalid_argument(fmt::format("--salt-file: {}", salt.status().message()));
  while (!salt->empty() && std::isspace(static_cast<unsigned char>(salt->back()))) salt->pop_back();
  if (salt->size() < 16) {
    return Status::invalid_argument(fmt::format(
        "--salt-file {}: {} bytes; a salt must be at least 16 (e.g. head -c 32 /dev/urandom | base64)", file,
        salt->size()));
  }
  return salt;
}

Status check_args(const ImportArgs& args) {
  auto bad = [](std::string_view flag, auto value, std::string_view expected) {
    return Status::invalid_argument(fmt::format("{}: must be {}, got {}", flag, expected, value));
  };
  if (args.block_size_tokens < 1 || args.block_size_tokens > (int64_t{1} << 30)) {
    return bad("--block-size", args.block_size_tokens, "in [1, 2^30]");
  }
  if (args.default_output_tokens < 1)
    return bad("--default-output-tokens", args.default_output_tokens, ">= 1");
  if (!(args.reorder_window_s >= 0) || args.reorder_window_s > 1e9) {
    return bad("--reorder-window-s", args.reorder_window_s, ">= 0");
  }
  if (!(args.session_rate_per_s > 0) || args.session_rate_per_s > 1e9) {
    return bad("--session-rate", args.session_rate_per_s, "> 0");
  }
  if (!(args.think_time_s >= 0) || args.think_time_s > 1e9)
    return bad("--think-time-s", args.think_time_s, ">= 0");
  if (args.out.empty()) return Status::invalid_argument("trace import: give --out TRACE");
  return Status();
}

int run_import(const ImportArgs& args) {
  if (Status checked = check_args(args); !checked.ok()) return fail(checked);
  const std::optional<trace::LogFormat> format = trace::parse_log_format(args.format);
  if (!format) {
    return fail(Status::invalid_argument(
        fmt::format("--format: must be openai-log, sharegpt or csv, got '{}'", args.format)));
  }
  trace::LogImportOptions options;
  options.format = *format;
  options.skip_invalid = args.skip_invalid;
  options.default_output_tokens = args.default_output_tokens;
  options.reorder_window_ms = static_cast<int64_t>(args.reorder_window_s * 1000.0);
  options.session_rate_per_s = args.session_rate_per_s;
  options.think_time_s = args.think_time_s;
  options.seed = args.seed;
  if (*format == trace::LogFormat::kCsv) {
    Result<trace::CsvColumns> columns = trace::parse_csv_columns(args.columns);
    if (!columns.ok()) return fail(columns.status());
    options.csv_columns = *columns;
  }

  // The tokenizer and chat template of the model the logged requests were served by.
  std::optional<PromptTokenizer> model_files;
  trace::PromptEncoder encoder;
  if (!args.tokenizer_file.empty() || !args.model_dir.empty()) {
    Result<PromptTokenizer> loaded = load_prompt_tokenizer(args.model_dir, args.tokenizer_file);
    if (!loaded.ok()) return fail(loaded.status());
    model_files = std::move(*loaded);
    encoder.tokenizer = model_files->tokenizer.get();
    if (model_files->chat_template) {
      const model::ChatTemplate& chat_template = *model_files->chat_template;
      encoder.render_chat = [&chat_template](const nlohmann::json& messages) {
        // Each message {role, content} in that order, as the server's chat endpoint renders them.
        nlohmann::ordered_json ordered = nlohmann::ordered_json::array();
        for (const auto& message : messages) {
          ordered.push_back({{"role", message["role"]}, {"content", message["content"]}});
        }
        return chat_template.render(ordered, /*add_generation_prompt=*/true);
      };
    }
  }  // else only records with token ids can be read (a text prompt is then an error naming the flags)

  Result<std::string> salt = load_salt(args.salt_file);
  if (!salt.ok()) return fail(salt.status());
  // The logs' sizes, for the progress bar: 0 for a pipe or a device (then no percentage).
  std::vector<int64_t> sizes;
  for (const std::string& log : args.logs) {
    std::error_code error;
    const auto status = std::filesystem::status(log, error);
    if (error || !std::filesystem::exists(status)) {
      return fail(Status::invalid_argument(fmt::format("{}: no such file", log)));
    }
    if (std::filesystem::is_directory(status)) {
      return fail(Status::invalid_argument(fmt::format("{}: a directory, not a log file", log)));
    }
    const bool regular = std::filesystem::is_regular_file(status);
    if (!regular && *format == trace::LogFormat::kShareGpt) {
      return fail(Status::invalid_argument(fmt::format(
          "{}: sharegpt logs are read twice (to tell a JSON array from JSONL): give a file, not a pipe",
          log)));
    }
    sizes.push_back(regular ? static_cast<int64_t>(std::filesystem::file_size(log, error)) : 0);
    if (error) sizes.back() = 0;
  }
  // Token ids are the text to anyone with the tokenizer: such a trace is its owner's alone.
  auto writer = trace::TraceWriter::open(args.out, args.keep_tokens ? 0600 : 0666);
  if (!writer.ok()) return fail(writer.status());
  trace::TraceImporter importer({.block_size_tokens = args.block_size_tokens,
                                 .salt = std::move(*salt),
                                 .dense_ids = !args.raw_keys,
                                 .keep_tokens = args.keep_tokens},
                                **writer);

  // A progress bar on a terminal: bytes of the logs read.
  StatusLine line;
  int64_t total_bytes = 0, done_bytes = 0, records = 0;
  for (const std::string& log : args.logs)
    total_bytes += static_cast<int64_t>(std::filesystem::file_size(log));
  if (line.enabled()) {
    options.progress = [&](int64_t file_bytes_read) {
      ++records;
      if (!line.due()) return;
      const double share =
          total_bytes > 0 ? static_cast<double>(done_bytes + file_bytes_read) / total_bytes : 1;
      const int width = 30;
      const int filled = std::clamp(static_cast<int>(share * width), 0, width);
      line.draw(fmt::format("importing [{}{}] {:.0f}%, {} records read", std::string(filled, '#'),
                            std::string(width - filled, '.'), share * 100, grouped(records)));
    };
  }
  trace::LogImporter reader(options, encoder, importer);
  for (size_t i = 0; i < args.logs.size(); ++i) {
    if (Status read = reader.read(args.logs[i]); !read.ok()) {
      line.clear();
      return fail(read);
    }
    done_bytes += sizes[i];
  }
  line.clear();
  if (Status finished = importer.finish(); !finished.ok()) return fail(finished);
  if (importer.report().requests == 0) {
    return fail(Status::invalid_argument(
        fmt::format("no requests imported{}", reader.skipped().total_lines > 0
                                                  ? fmt::format(" ({})", reader.skipped().summary())
                                                  : std::string())));
  }
  if (Status committed = (*writer)->commit(); !committed.ok()) return fail(committed);

  const trace::ImportReport& report = importer.report();
  if (!reader.skipped().reasons.empty()) fmt::print(stderr, "trace import: {}\n", reader.skipped().summary());
  fmt::print(
      stderr,
      "trace import: {} requests ({} sessions), {} input tokens in {} distinct blocks of {} tokens, {} "
      "output tokens -> {}\n",
      grouped(report.requests), grouped(report.sessions), grouped(report.input_tokens),
      grouped(report.distinct_blocks), args.block_size_tokens, grouped(report.output_tokens), args.out);
  if (report.lengths_only_requests > 0) {
    fmt::print(
        stderr,
        "trace import: {} requests had lengths only (no text): each of their blocks has a key of its own, "
        "so this trace carries no prefix reuse from them; its reuse ceiling says nothing about your "
        "workload's\n",
        grouped(report.lengths_only_requests));
  }
  return 0;
}

}  // namespace

void register_trace_import(CLI::App& trace_cmd, int& exit_code) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* cmd = trace_cmd.add_subcommand(
      "import", "Request logs -> a Mooncake-format trace (salted block keys: no text is written)");
  cmd->add_option("logs", args->logs, "Log files (plain or .gz)")->required();
  cmd->add_option("--format", args->format,
                  "openai-log (JSONL of request bodies), sharegpt (conversations) or csv (lengths only)")
      ->capture_default_str();
  CLI::Option* model = cmd->add_option("--model", args->model_dir,
                                       "Model directory: its tokenizer and chat template count the prompts");
  CLI::Option* file = cmd->add_option("--tokenizer", args->tokenizer_file, "A Hugging Face tokenizer.json");
  model->excludes(file);
  cmd->add_option("--out", args->out, "The trace to write (JSONL; '-' for stdout)")->required();
  cmd->add_option("--block-size", args->block_size_tokens, "Tokens per block key")->capture_default_str();
  cmd->add_option("--salt-file", args->salt_file,
                  "A secret (>= 16 bytes) seeding the block keys; default: a random one, not kept");
  cmd->add_flag(
      "--raw-keys", args->raw_keys,
      "Write the salted 64-bit keys instead of renumbering them 0, 1, 2, ... (imports sharing a salt "
      "file can then be compared)");
  cmd->add_flag("--keep-tokens", args->keep_tokens,
                "Also write each prompt's token ids (re-analysis at other block sizes; reveals the text to "
                "anyone with the tokenizer)");
  cmd->add_flag("--skip-invalid", args->skip_invalid,
                "Skip invalid records (counted on stderr) instead of failing");
  cmd->add_option("--default-output-tokens", args->default_output_tokens,
                  "Output length of a request whose record says none")
      ->capture_default_str();
  cmd->add_option("--reorder-window-s", args->reorder_window_s,
                  "openai-log, csv: how far out of time order records may be")
      ->capture_default_str();
  cmd->add_option("--session-rate", args->session_rate_per_s, "sharegpt: conversations starting per second")
      ->capture_default_str();
  cmd->add_option("--think-time-s", args->think_time_s, "sharegpt: seconds between a conversation's turns")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "sharegpt: seed of the conversations' start times")
      ->capture_default_str();
  cmd->add_option("--columns", args->columns,
                  "csv: 'azure', 'burstgpt' or timestamp=COL,input=COL,output=COL[,session=COL]")
      ->capture_default_str();
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_import(*args); }); });
}

}  // namespace crescent::cli
