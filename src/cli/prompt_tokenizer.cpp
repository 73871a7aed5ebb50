#include "cli/prompt_tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/hf_tokenizer.h"

namespace crescent::cli {
namespace {

// The model directory's vocab_size (config.json), or no limit when it has no config.json.
Result<int64_t> model_vocab_size(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return std::numeric_limits<int64_t>::max();
  try {
    const nlohmann::json config = nlohmann::json::parse(in);
    if (!config.contains("vocab_size")) return std::numeric_limits<int64_t>::max();
    return config.at("vocab_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace

Status PromptTokenizer::no_chat_template(std::string_view what) const {
  return Status::invalid_argument(
      fmt::format("{}: {} has no chat template (no chat_template in {})", what, source, template_file));
}

Result<PromptTokenizer> load_prompt_tokenizer(const std::string& model_dir, const std::string& tokenizer_file) {
  PromptTokenizer out;
  std::string dir;
  if (!tokenizer_file.empty()) {
    auto tokenizer = model::load_huggingface_tokenizer(tokenizer_file);
    if (!tokenizer.ok()) return tokenizer.status();
    out.tokenizer = std::move(*tokenizer);
    dir = std::filesystem::path(tokenizer_file).parent_path().string();
    if (dir.empty()) dir = ".";
    out.source = "the directory of --tokenizer " + tokenizer_file;
    out.template_file = dir + "/tokenizer_config.json beside it";
  } else {
    if (!std::filesystem::is_directory(model_dir)) {
      return Status::invalid_argument(fmt::format("--model {}: not a directory", model_dir));
    }
    auto vocab_size = model_vocab_size(model_dir);
    if (!vocab_size.ok()) return vocab_size.status();
    auto tokenizer = model::load_tokenizer(model_dir, *vocab_size);
    if (!tokenizer.ok()) return tokenizer.status();
    out.tokenizer = std::move(*tokenizer);
    dir = model_dir;
    out.source = "--model " + model_dir;
    out.template_file = dir + "/tokenizer_config.json";
  }
  auto chat_template = model::load_model_chat_template(dir);
  if (!chat_template.ok()) return chat_template.status();
  out.chat_template = std::move(*chat_template);
  return out;
}

}  // namespace crescent::cli
