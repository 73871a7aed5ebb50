// `crescent tokenize`: text on stdin → token ids on stdout, as the server tokenizes prompts (issue 23 §1).
//   crescent tokenize (--model DIR | --tokenizer FILE) [--json] [--jsonl] [--chat]
// Special-token strings in the text become their ids; nothing is added around the text (no BOS/EOS).
// --json prints a JSON array instead of space-separated ids; --jsonl reads one JSON string a line and prints
// one JSON array a line. --chat: stdin is an OpenAI `messages` array (with --jsonl, one a line), rendered
// with the generation prompt through the model's chat template (DIR's, or the one beside FILE:
// model/chat_template.h, issue 23 §2) before it is encoded. Exit 2 on bad input (unreadable tokenizer, a
// line that is not a JSON string or messages array, no chat template, a template that fails).
#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/prompt_tokenizer.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace crescent::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir;
  std::string tokenizer_file;
  bool chat = false;
  bool json = false;
  bool jsonl = false;
};

std::string ids_text(const std::vector<int64_t>& ids, bool json) {
  if (json) return nlohmann::json(ids).dump();
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

// The prompt text of one --chat input: a messages array rendered with the generation prompt.
Result<std::string> chat_text(const model::ChatTemplate& chat_template, const std::string& input,
                              const std::string& where) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded()) return Status::invalid_argument(fmt::format("{}: not valid JSON", where));
  if (!messages.is_array()) {
    return Status::invalid_argument(fmt::format("{}: --chat input must be a JSON array of messages", where));
  }
  auto text = chat_template.render(messages, /*add_generation_prompt=*/true);
  if (!text.ok()) return Status::invalid_argument(fmt::format("{}: {}", where, text.status().message()));
  return text;
}

int run_tokenize(const TokenizeArgs& args) {
  Result<PromptTokenizer> loaded = load_prompt_tokenizer(args.model_dir, args.tokenizer_file);
  if (!loaded.ok()) return fail(loaded.status());
  const model::Tokenizer& t = *loaded->tokenizer;
  std::optional<model::ChatTemplate> chat_template;
  if (args.chat) {
    if (!loaded->chat_template) return fail(loaded->no_chat_template("--chat"));
    chat_template = std::move(loaded->chat_template);
  }
  if (!args.jsonl) {
    std::string text(std::istreambuf_iterator<char>(std::cin), {});
    if (chat_template) {
      auto rendered = chat_text(*chat_template, text, "<stdin>");
      if (!rendered.ok()) return fail(rendered.status());
      text = std::move(*rendered);
    }
    fmt::print("{}\n", ids_text(t.encode(text), args.json));
    return 0;
  }
  std::string line;
  for (int64_t number = 1; std::getline(std::cin, line); ++number) {
    const std::string where = fmt::format("<stdin>:{}", number);
    std::string text;
    if (chat_template) {
      auto rendered = chat_text(*chat_template, line, where);
      if (!rendered.ok()) return fail(rendered.status());
      text = std::move(*rendered);
    } else {
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (!j.is_string()) throw std::invalid_argument("not a JSON string");
        text = j.get<std::string>();
      } catch (const std::exception& e) {
        return fail(Status::invalid_argument(
            fmt::format("{}: each --jsonl line must be one JSON string: {}", where, e.what())));
      }
    }
    fmt::print("{}\n", ids_text(t.encode(text), true));
  }
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Text on stdin to token ids (special-token strings recognised; no BOS/EOS)");
  CLI::Option* model = cmd->add_option(
      "--model", args->model_dir, "A model directory: its tokenizer.json, else tokenizer.model, else bytes");
  CLI::Option* file = cmd->add_option("--tokenizer", args->tokenizer_file, "A Hugging Face tokenizer.json");
  model->excludes(file);
  cmd->add_flag(
      "--chat", args->chat,
      "Stdin is an OpenAI messages array, rendered with the model's chat template and the generation "
      "prompt before it is encoded");
  cmd->add_flag("--json", args->json, "Print the ids as a JSON array");
  cmd->add_flag(
      "--jsonl", args->jsonl,
      "Each stdin line is a JSON string (with --chat, a messages array); print one JSON array of ids a "
      "line");
  cmd->callback([args, model, file, &exit_code] {
    if (model->count() == 0 && file->count() == 0) {
      exit_code = fail(Status::invalid_argument("tokenize: give --model DIR or --tokenizer FILE"));
      return;
    }
    run_guarded(exit_code, [&] { return run_tokenize(*args); });
  });
}

}  // namespace crescent::cli
