// serve --request-log's file (serve/request_log.h): what each mode keeps, millisecond times, and who may read
// it.
#include "serve/request_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::serve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(RequestLog, TimesAreIsoWithMilliseconds) {
  // Expected values from GNU date (date -u -d @1796281200.25 +%FT%T.%3NZ).
  EXPECT_EQ(iso8601_utc_ms(1796281200250), "2026-12-03T07:00:00.250Z");
  EXPECT_EQ(iso8601_utc_ms(5), "1970-01-01T00:00:00.005Z");
  EXPECT_EQ(iso8601_utc_ms(1796281200999), "2026-12-03T07:00:00.999Z");
}

TEST(RequestLog, EachModeKeepsWhatItSaysAndTheFileIsTheOwnersAlone) {
  test::TempDir dir;
  const json body = {{"model", "m"},
                     {"messages", {{{"role", "user"}, {"content", "secret text"}}}},
                     {"stop", {"also text"}},
                     {"user", "ann@example.com"},
                     {"max_tokens", 7}};
  const std::vector<int64_t> ids = {5, 6, 7};
  for (auto content : {RequestLogContent::kText, RequestLogContent::kTokenIds}) {
    const std::string path = dir.file(content == RequestLogContent::kText ? "text.jsonl" : "ids.jsonl");
    {
      auto log = RequestLog::open(path, content);
      ASSERT_TRUE(log.ok()) << log.status().message();
      (*log)->append(1796281200250, body, ids, 3, 0);
      (*log)->append(1796281200251, body, ids, 4, 3);
    }
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    std::ifstream in(path);
    std::vector<json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0]["timestamp"], "2026-12-03T07:00:00.250Z");
    EXPECT_EQ(lines[0]["prompt_token_ids"], json(ids));  // both modes: what the model read
    EXPECT_EQ(lines[1]["usage"]["completion_tokens"], 4);
    EXPECT_EQ(lines[1]["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    const std::string text = lines[0].dump();
    if (content == RequestLogContent::kText) {
      EXPECT_EQ(lines[0]["request"], body);
    } else {
      EXPECT_EQ(lines[0]["request"], json({{"model", "m"}, {"max_tokens", 7}}));
      for (const char* kept : {"secret text", "also text", "ann@example.com"}) {
        EXPECT_THAT(text, ::testing::Not(HasSubstr(kept))) << kept;
      }
    }
  }
  // An existing file others may read is refused rather than filled with prompts; a symlink is not followed.
  const std::string shared = dir.file("shared.jsonl");
  std::ofstream(shared) << "";
  ASSERT_EQ(::chmod(shared.c_str(), 0644), 0);
  auto refused = RequestLog::open(shared, RequestLogContent::kText);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("chmod 600"));
  const std::string link = dir.file("link.jsonl");
  ASSERT_EQ(::symlink(dir.file("text.jsonl").c_str(), link.c_str()), 0);
  EXPECT_FALSE(RequestLog::open(link, RequestLogContent::kText).ok());
}

}  // namespace
}  // namespace crescent::serve
