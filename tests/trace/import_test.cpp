// trace import's two halves: TraceImporter (keys, order, sessions) and LogImporter (the three log formats),
// with the byte tokenizer (a token is a byte, so expected ids are the text's bytes) and a toy chat template.
#include "trace/import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_support/temp_dir.h"
#include "trace/log_import.h"
#include "trace/reader.h"
#include "trace/writer.h"

namespace crescent::trace {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> ids_of(std::string_view text) {
  return std::vector<int64_t>(text.begin(), text.end());
}

LoggedRequest logged(int64_t timestamp_ms, std::string_view text, std::optional<std::string> session = {}) {
  return LoggedRequest{timestamp_ms, static_cast<int64_t>(text.size()), ids_of(text), 1, std::move(session),
                       "log:1"};
}

// The requests of the trace at `path`, hash_ids read at `block_size` (session ids are checked by the tests
// through the raw lines).
std::vector<json> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// `before`, 100,000 nested arrays, `after`: JSON that would overflow a stack as a tree.
std::string deeply_nested(std::string_view before, std::string_view after) {
  std::string text(before);
  text.append(100'000, '[').append(100'000, ']').append(after);
  return text;
}

class ImportTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (fs::path(dir_.path()) / name).string(); }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path(name)) << content;
    return path(name);
  }
  // Imports `requests` with `options` into out.jsonl and returns its lines.
  std::vector<json> import(std::vector<LoggedRequest> requests, ImportOptions options) {
    auto writer = TraceWriter::open(path("out.jsonl"));
    EXPECT_TRUE(writer.ok());
    TraceImporter importer(std::move(options), **writer);
    for (LoggedRequest& request : requests) EXPECT_TRUE(importer.add(std::move(request)).ok());
    EXPECT_TRUE(importer.finish().ok());
    EXPECT_TRUE((*writer)->commit().ok());
    return lines_of(path("out.jsonl"));
  }

  test::TempDir dir_;
};

TEST_F(ImportTest, KeysAreChainedPerBlockAndRenumberedInArrivalOrder) {
  // Block size 4. "SYS:abcd" and "SYS:abXY" share their first block only; the third request arrives first.
  const auto lines = import({logged(10, "SYS:abcd"), logged(20, "SYS:abXYz"), logged(5, "abcdSYS:")},
                            {.block_size_tokens = 4, .salt = "a salt of sixteen bytes"});
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["timestamp"], 0);            // relative to the earliest arrival
  EXPECT_EQ(lines[0]["hash_ids"], json({0, 1}));  // "abcd", "abcdSYS:": a block keys everything before it
  EXPECT_EQ(lines[1]["timestamp"], 5);
  EXPECT_EQ(lines[1]["hash_ids"], json({2, 3}));     // "SYS:" then "SYS:abcd"
  EXPECT_EQ(lines[2]["hash_ids"], json({2, 4, 5}));  // shares "SYS:", then its own, then the partial "z"
  EXPECT_EQ(lines[2]["input_length"], 9);
  EXPECT_FALSE(lines[2].contains("token_ids"));
  EXPECT_FALSE(lines[2].contains("session_id"));
}

TEST_F(ImportTest, TheSaltChangesEveryRawKeyAndTheSameSaltGivesTheSameKeys) {
  auto raw = [&](std::string salt) {
    return import({logged(0, "abcdefgh")},
                  {.block_size_tokens = 4, .salt = std::move(salt), .dense_ids = false})
        .at(0)["hash_ids"];
  };
  const json first = raw("salt number one!!"), again = raw("salt number one!!"),
             other = raw("salt number two!!");
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first, again);
  EXPECT_NE(first[0], other[0]);
  EXPECT_NE(first[1], other[1]);
}

TEST_F(ImportTest, SessionsAreRenumberedAndTokensKeptOnlyWhenAsked) {
  const auto lines =
      import({logged(0, "ab", "alice"), logged(1, "cd", "bob"), logged(2, "ef", "alice"), logged(3, "gh")},
             {.block_size_tokens = 4, .keep_tokens = true});
  EXPECT_EQ(lines[0]["session_id"], 0);
  EXPECT_EQ(lines[1]["session_id"], 1);
  EXPECT_EQ(lines[2]["session_id"], 0);
  EXPECT_FALSE(lines[3].contains("session_id"));
  EXPECT_EQ(lines[1]["token_ids"], json(ids_of("cd")));
}

TEST_F(ImportTest, LengthsOnlyRequestsShareNoBlock) {
  std::vector<LoggedRequest> requests(2);
  requests[0] = {.timestamp_ms = 0, .input_tokens = 9, .token_ids = {}, .output_tokens = 3};
  requests[1] = {.timestamp_ms = 1, .input_tokens = 9, .token_ids = {}, .output_tokens = 3};
  const auto lines = import(std::move(requests), {.block_size_tokens = 4});
  EXPECT_EQ(lines[0]["hash_ids"], json({0, 1, 2}));
  EXPECT_EQ(lines[1]["hash_ids"], json({3, 4, 5}));
}

TEST_F(ImportTest, ARequestEarlierThanWhatWasWrittenIsRefused) {
  auto writer = TraceWriter::open(path("out.jsonl"));
  ASSERT_TRUE(writer.ok());
  TraceImporter importer({.block_size_tokens = 4}, **writer);
  ASSERT_TRUE(importer.add(logged(100, "ab")).ok());
  ASSERT_TRUE(importer.release_before(50).ok());
  EXPECT_TRUE(importer.add(logged(60, "cd")).ok());  // after the released time: still in order
  const Status late = importer.add(logged(40, "ef"));
  EXPECT_THAT(late.message(), HasSubstr("log:1: arrives at 40 ms"));
  LoggedRequest empty = logged(70, "");
  EXPECT_THAT(importer.add(std::move(empty)).message(), HasSubstr("no tokens"));
}

TEST(Timestamps, IsoAndUnixFormsGiveUnixMilliseconds) {
  // Expected values from GNU date (date -u -d '...' +%s%3N).
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("2026-12-03T07:00:00Z")), 1796281200000);
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("2026-12-03T08:30:00+01:30")), 1796281200000);
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("2026-12-03 07:00:00.25")), 1796281200250);
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("2023-11-16 18:15:46.6805900")), 1700158546680);
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("1796281200")), 1796281200000);  // seconds
  EXPECT_EQ(*parse_timestamp_ms(json(1796281200.5)), 1796281200500);
  EXPECT_EQ(*parse_timestamp_ms(json(1796281200000)), 1796281200000);        // milliseconds
  EXPECT_EQ(*parse_timestamp_ms(json(5.25)), 5250);                          // seconds since a trace's start
  EXPECT_EQ(*parse_timestamp_ms(json(1796281200250000)), 1796281200250);     // microseconds
  EXPECT_EQ(*parse_timestamp_ms(json(1796281200250000000)), 1796281200250);  // nanoseconds
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("2026-12-03T08:00:00+0100")), 1796281200000);
  EXPECT_EQ(*parse_timestamp_ms(std::string_view("2026-12-03T00:00:00-07:00")), 1796281200000);
  for (const char* bad : {"yesterday", "2026-13-03T07:00:00Z", "2026-12-03T07:00:00 trailing", "-5", "",
                          "2600-01-01T00:00:00Z", "2026-12-03T07:00:00+25:00", "2026-12-03T07:00:00-99:99"}) {
    EXPECT_FALSE(parse_timestamp_ms(std::string_view(bad)).ok()) << bad;
  }
  EXPECT_FALSE(parse_timestamp_ms(json(true)).ok());
  EXPECT_FALSE(parse_timestamp_ms(json::array()).ok());
}

TEST(CsvColumns, PresetsAndMapsAndTheirErrors) {
  EXPECT_EQ(parse_csv_columns("azure")->input_tokens, "ContextTokens");
  EXPECT_EQ(parse_csv_columns("burstgpt")->output_tokens, "Response tokens");
  const auto mapped = parse_csv_columns("timestamp=t,input=in,output=out,session=user");
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(mapped->session, "user");
  EXPECT_THAT(parse_csv_columns("timestamp=t,input=in").status().message(), HasSubstr("no 'output=COLUMN'"));
  EXPECT_THAT(parse_csv_columns("time=t,input=in,output=o").status().message(),
              HasSubstr("unknown name 'time'"));
  EXPECT_THAT(parse_csv_columns("t,in,out").status().message(), HasSubstr("'t' is not NAME=COLUMN"));
}

// LogImporter with the byte tokenizer and a toy template "[role]content" per message, then "[assistant]".
class LogImportTest : public ImportTest {
 protected:
  LogImportTest() : tokenizer_(model::byte_tokenizer()) {
    encoder_.tokenizer = tokenizer_.get();
    encoder_.render_chat = [](const json& messages) -> Result<std::string> {
      std::string text;
      for (const json& m : messages) {
        text.append("[").append(m["role"].get<std::string>()).append("]");
        text.append(m["content"].get<std::string>());
      }
      text.append("[assistant]");
      return text;
    };
  }
  // Imports the logs with `options` at block size 4; the error when the import fails.
  Result<std::vector<json>> read(const std::vector<std::string>& logs, LogImportOptions options) {
    auto writer = TraceWriter::open(path("out.jsonl"));
    EXPECT_TRUE(writer.ok());
    TraceImporter importer({.block_size_tokens = 4, .keep_tokens = true}, **writer);
    LogImporter reader(std::move(options), encoder_, importer);
    for (const std::string& log : logs) CRESCENT_RETURN_IF_ERROR(reader.read(log));
    CRESCENT_RETURN_IF_ERROR(importer.finish());
    CRESCENT_RETURN_IF_ERROR((*writer)->commit());
    skipped_ = reader.skipped();
    return lines_of(path("out.jsonl"));
  }

  std::unique_ptr<model::Tokenizer> tokenizer_;
  PromptEncoder encoder_;
  SkipReport skipped_;
};

TEST_F(LogImportTest, OpenAiLogBodiesBecomeTheirPromptsTokens) {
  const std::string log = write(
      "log.jsonl",
      R"({"timestamp": 10, "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "user": "u1"}})"
      "\n"
      R"({"timestamp": 11.5, "request": {"prompt": "plain"}, "usage": {"completion_tokens": 3}})"
      "\n"
      "\n"
      R"({"timestamp": 12, "prompt": ["one"], "session_id": 42})"
      "\n"
      R"({"timestamp": 13, "request": {"prompt": [5, 6, 7]}, "response": {"usage": {"completion_tokens": 2}}})"
      "\n"
      R"({"timestamp": 14, "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, "prompt_token_ids": [9, 9]})"
      "\n"
      R"({"timestamp": 15, "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}})"
      "\n");
  auto lines = read({log}, {.default_output_tokens = 99});
  ASSERT_TRUE(lines.ok()) << lines.status().message();
  ASSERT_EQ(lines->size(), 6u);
  const auto& l = *lines;
  EXPECT_EQ(l[0]["token_ids"], json(ids_of("[user]hi[assistant]")));
  EXPECT_EQ(l[0]["output_length"], 7);
  EXPECT_EQ(l[0]["session_id"], 0);
  EXPECT_EQ(l[1]["timestamp"], 1500);  // seconds in the log, ms in the trace, from the first arrival
  EXPECT_EQ(l[1]["token_ids"], json(ids_of("plain")));
  EXPECT_EQ(l[1]["output_length"], 3);
  EXPECT_EQ(l[2]["token_ids"], json(ids_of("one")));
  EXPECT_EQ(l[2]["output_length"], 99);
  EXPECT_EQ(l[2]["session_id"], 1);
  EXPECT_EQ(l[3]["token_ids"], json({5, 6, 7}));
  EXPECT_EQ(l[3]["output_length"], 2);
  EXPECT_EQ(l[4]["token_ids"], json({9, 9}));  // the ids the server logged win over the body
  EXPECT_EQ(l[5]["token_ids"], json(ids_of("[user]ab[assistant]")));
  // "usage": null (a streamed response's) is no usage: max_tokens, then the default, decide.
  const std::string null_usage =
      write("null.jsonl", R"({"timestamp": 1, "prompt": "x", "usage": null, "max_tokens": 4})"
                          "\n");
  auto with_null = read({null_usage}, {});
  ASSERT_TRUE(with_null.ok()) << with_null.status().message();
  EXPECT_EQ((*with_null)[0]["output_length"], 4);
}

TEST_F(LogImportTest, ALengthNoTraceLineCanHoldIsRefusedBeforeItsKeysAreMade) {
  const std::string csv =
      write("huge.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,100000000000,20\n2,10,3\n");
  auto failed = read({csv}, {.format = LogFormat::kCsv});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(),
              HasSubstr("huge.csv:2: 100000000000 input tokens are 25000000000 blocks"));
  auto skipped = read({csv}, {.format = LogFormat::kCsv, .skip_invalid = true});
  ASSERT_TRUE(skipped.ok()) << skipped.status().message();
  EXPECT_EQ(skipped->size(), 1u);
}

TEST_F(LogImportTest, BadRecordsNameTheLineAndFieldOrAreSkippedAndCounted) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(not json)", "log.jsonl:1: not JSON"},
      {R"([1])", "log.jsonl:1: not a JSON object"},
      {R"({"request": {"prompt": "x"}})", "missing field 'timestamp'"},
      {R"({"timestamp": "noon", "prompt": "x"})", "field 'timestamp'"},
      {R"({"timestamp": 1, "request": {"model": "m"}})",
       "missing field 'request.messages' or 'request.prompt'"},
      {R"({"timestamp": 1, "request": {"prompt": ["a", "b"]}})", "field 'request.prompt': holds 2 prompts"},
      {R"({"timestamp": 1, "request": {"prompt": [1, -2]}})", "field 'request.prompt[1]'"},
      {R"({"timestamp": 1, "request": {"messages": [{"content": "x"}]}})", "field 'request.messages[0]'"},
      {R"({"timestamp": 1, "request": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}})",
       "field 'request.messages[0].content[0]': only text parts"},
      {R"({"timestamp": 1, "request": {"prompt": "x", "max_tokens": 0}})", "field 'request.max_tokens'"},
      {R"({"timestamp": 1, "request": {"prompt": "x"}, "usage": {"completion_tokens": 0}})",
       "field 'usage.completion_tokens': is 0"},
      {R"({"timestamp": 1, "request": {"prompt": ""}})", "the prompt has no tokens"},
      {R"({"timestamp": 1, "request": {"prompt": "x"}, "session_id": [1]})", "field 'session_id'"},
      {R"({"timestamp": 1, "request": {"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]}})",
       "field 'request.messages[0].content[0]': only text parts"},
      {R"({"timestamp": 1, "request": {"messages": [{"role": "user", "content": null}]}})",
       "field 'request.messages[0].content'"},
      {deeply_nested(R"({"timestamp": 1, "x": )", "}"), "nests deeper than 64 levels"},
  };
  for (const auto& [line, message] : cases) {
    const std::string log = write("log.jsonl", line + "\n");
    auto failed = read({log}, {});
    ASSERT_FALSE(failed.ok()) << line;
    EXPECT_THAT(failed.status().message(), HasSubstr(message)) << line;
    EXPECT_THAT(failed.status().message(), HasSubstr("log.jsonl:1")) << line;
    const std::string mixed =
        write("mixed.jsonl", line + "\n" + R"({"timestamp": 2, "prompt": "ok"})" + "\n");
    auto skipped = read({mixed}, {.skip_invalid = true});
    ASSERT_TRUE(skipped.ok()) << line << ": " << skipped.status().message();
    EXPECT_EQ(skipped->size(), 1u) << line;
    EXPECT_EQ(skipped_.total_lines, 1) << line;
  }
  // Messages without a chat template stop the import even with --skip-invalid: no line could be read.
  encoder_.render_chat = nullptr;
  const std::string chat =
      write("chat.jsonl", R"({"timestamp": 1, "messages": [{"role": "user", "content": "x"}]})"
                          "\n");
  auto no_template = read({chat}, {.skip_invalid = true});
  ASSERT_FALSE(no_template.ok());
  EXPECT_THAT(no_template.status().message(), HasSubstr("need the model's chat template"));
}

TEST_F(LogImportTest, OpenAiLogRecordsOutOfOrderWithinTheWindowAreSorted) {
  const std::string log = write("log.jsonl", R"({"timestamp": 10, "prompt": "b"})"
                                             "\n"
                                             R"({"timestamp": 8, "prompt": "a"})"
                                             "\n"
                                             R"({"timestamp": 30, "prompt": "c"})"
                                             "\n"
                                             R"({"timestamp": 12, "prompt": "d"})"
                                             "\n");
  auto sorted = read({log}, {.reorder_window_ms = 20'000});
  ASSERT_TRUE(sorted.ok()) << sorted.status().message();
  std::vector<json> order;
  for (const json& line : *sorted) order.push_back(line["token_ids"]);
  EXPECT_THAT(order, ElementsAre(json(ids_of("a")), json(ids_of("b")), json(ids_of("d")), json(ids_of("c"))));
  auto strict = read({log}, {.reorder_window_ms = 1'000});
  ASSERT_FALSE(strict.ok());
  EXPECT_THAT(strict.status().message(), HasSubstr("log.jsonl:2: arrives at 8000 ms"));
}

TEST_F(LogImportTest, ShareGptTurnsArePromptsOfTheConversationSoFar) {
  const std::string conversations = R"([
    {"id": "a", "conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "q1"},
                                  {"from": "gpt", "value": "answer"}, {"from": "human", "value": "q2"}]},
    {"id": "b", "messages": [{"role": "user", "content": "other"}]}
  ])";
  const std::string array = write("share.json", conversations);
  std::string jsonl;
  for (const json& c : json::parse(conversations)) jsonl += c.dump() + "\n";
  const std::string lines_file = write("share.jsonl", jsonl);
  for (const std::string& log : {array, lines_file}) {
    auto lines = read({log}, {.format = LogFormat::kShareGpt,
                              .default_output_tokens = 5,
                              .session_rate_per_s = 0.001,
                              .think_time_s = 2});
    ASSERT_TRUE(lines.ok()) << lines.status().message();
    ASSERT_EQ(lines->size(), 3u);
    const auto& l = *lines;
    EXPECT_EQ(l[0]["token_ids"], json(ids_of("[system]S[user]q1[assistant]")));
    EXPECT_EQ(l[0]["output_length"], 6);  // "answer": 6 bytes
    EXPECT_EQ(l[1]["timestamp"], 2000);   // the second turn, one think time later
    EXPECT_EQ(l[1]["token_ids"], json(ids_of("[system]S[user]q1[assistant]answer[user]q2[assistant]")));
    EXPECT_EQ(l[1]["output_length"], 5);  // no answer in the log: the default
    EXPECT_EQ(l[0]["session_id"], l[1]["session_id"]);
    // The second conversation starts after an exponential gap at 0.001/s: almost surely well after 2 s.
    EXPECT_GT(l[2]["timestamp"].get<int64_t>(), 2000);
    EXPECT_NE(l[2]["session_id"], l[0]["session_id"]);
    // The follow-up's first blocks are the first turn's: the reuse a conversation brings.
    EXPECT_EQ(l[1]["hash_ids"][0], l[0]["hash_ids"][0]);
  }
  const std::string bad = write("bad.json", R"([{"conversations": [{"from": "robot", "value": "x"}]}])");
  auto failed = read({bad}, {.format = LogFormat::kShareGpt});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(),
              HasSubstr("bad.json: conversation 0: field 'conversations[0].from'"));
  const std::string truncated =
      write("cut.json", R"([{"conversations": [{"from": "human", "value": "x"}]}, {"conv)");
  failed = read({truncated}, {.format = LogFormat::kShareGpt});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("cut.json: not JSON"));
  const std::string deep = write("deep.json", deeply_nested("[", "]"));
  failed = read({deep}, {.format = LogFormat::kShareGpt});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("deep.json: conversation 0 nests deeper than 64 levels"));
  const std::string nested = write("nested.json", R"([[{"conversations": []}], 7])");
  failed = read({nested}, {.format = LogFormat::kShareGpt});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("nested.json: conversation 0: not a JSON object, got [{"));
  const std::string object = write("object.json", R"({"conversations": 5})");
  failed = read({object}, {.format = LogFormat::kShareGpt});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("object.json:1: field 'conversations'"));
}

TEST_F(LogImportTest, CsvLengthsWithQuotedHeadersAndTheirErrors) {
  const std::string csv = write("burst.csv",
                                "Timestamp,Model,\"Request tokens\",\"Response tokens\"\n"
                                "5,ChatGPT,1000,20\n"
                                "\n"
                                "7.5,\"GPT-4, big\",600,1\n");
  auto lines = read({csv}, {.format = LogFormat::kCsv, .csv_columns = *parse_csv_columns("burstgpt")});
  ASSERT_TRUE(lines.ok()) << lines.status().message();
  ASSERT_EQ(lines->size(), 2u);
  EXPECT_EQ((*lines)[1]["timestamp"], 2500);
  EXPECT_EQ((*lines)[1]["input_length"], 600);
  EXPECT_EQ((*lines)[0]["hash_ids"].size(), 250u);  // ceil(1000 / 4)
  EXPECT_FALSE((*lines)[0].contains("token_ids"));

  const std::string sessions =
      write("sessions.csv", "t,in,out,user\n1,4,1, ann \n2,4,1,\n3,4,1,ann\n4,4,1,\n");
  lines =
      read({sessions}, {.format = LogFormat::kCsv,
                        .csv_columns = *parse_csv_columns("timestamp=t,input=in,output=out,session=user")});
  ASSERT_TRUE(lines.ok()) << lines.status().message();
  ASSERT_EQ(lines->size(), 4u);
  EXPECT_EQ((*lines)[0]["session_id"], 0);
  EXPECT_FALSE((*lines)[1].contains("session_id"));  // an empty cell is no session
  EXPECT_EQ((*lines)[2]["session_id"], 0);           // " ann " and "ann" are one user
  EXPECT_FALSE((*lines)[3].contains("session_id"));

  const std::string zero = write("zero.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,0\n2,10,3\n");
  auto failed = read({zero}, {.format = LogFormat::kCsv});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(),
              HasSubstr("zero.csv:2: field 'GeneratedTokens': must be an integer >= 1, got '0'"));
  auto skipped = read({zero}, {.format = LogFormat::kCsv, .skip_invalid = true});
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(skipped->size(), 1u);
  const std::string wrong = write("wrong.csv", "time,in,out\n1,2,3\n");
  failed = read({wrong}, {.format = LogFormat::kCsv});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("no column 'TIMESTAMP' (it has 'time', 'in', 'out')"));
  // A quoted cell may hold a newline: the row is named by the line it starts on.
  const std::string multi = write("multi.csv",
                                  "TIMESTAMP,ContextTokens,GeneratedTokens,note\n1,5,2,\"two\nlines\"\n"
                                  "2,x,3,\"a\nb\"\n");
  failed = read({multi}, {.format = LogFormat::kCsv});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("multi.csv:4: field 'ContextTokens'"));
  // A quoted cell never closed is an error at the line its row starts on, not data swallowed silently.
  std::string open_quote = "TIMESTAMP,ContextTokens,GeneratedTokens\n1,5,2\n2,5,\"3\n";
  for (int i = 0; i < 50; ++i) open_quote += "3,5,2\n";
  const std::string unterminated = write("open.csv", open_quote);
  for (bool skip : {false, true}) {
    failed = read({unterminated}, {.format = LogFormat::kCsv, .skip_invalid = skip});
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.status().message(), HasSubstr("open.csv:3: a quoted cell is never closed"));
  }
  const std::string ragged = write("ragged.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n");
  failed = read({ragged}, {.format = LogFormat::kCsv});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("ragged.csv:2: 2 cells, the header has 3"));
}

}  // namespace
}  // namespace crescent::trace
