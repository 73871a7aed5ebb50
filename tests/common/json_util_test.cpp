#include "common/json_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "test_support/temp_dir.h"

namespace crescent {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(JsonFields, ReadsTypedFieldsAndNamesBadOnes) {
  json j = {{"n", 4}, {"x", 2.5}, {"s", "hi"}, {"neg", -1}, {"str", "7"}};
  JsonFields f(j, "c.json");
  int64_t n = 0;
  double x = 0;
  std::string s;
  EXPECT_TRUE(f.integer("n", n, 1).ok());
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(f.positive_number("x", x).ok());
  EXPECT_EQ(x, 2.5);
  EXPECT_TRUE(f.string("s", s).ok());
  EXPECT_EQ(s, "hi");
  EXPECT_THAT(f.integer("neg", n, 0).message(), HasSubstr("c.json: field 'neg' must be >= 0, got -1"));
  EXPECT_THAT(f.integer("x", n, 0).message(), HasSubstr("'x' must be an integer"));
  EXPECT_THAT(f.positive_number("str", x).message(), HasSubstr("'str' must be a number"));
  EXPECT_THAT(f.positive_number("neg", x).message(), HasSubstr("'neg' must be > 0"));
  EXPECT_THAT(f.integer("missing", n, 0).message(), HasSubstr("missing field 'missing'"));
  EXPECT_TRUE(f.integer("missing", n, 0, /*required=*/false).ok());
  EXPECT_EQ(n, 4);  // unchanged when absent
}

TEST(JsonFields, UnknownKeysAreNamed) {
  json j = {{"a", 1}, {"typo", 2}};
  auto st = JsonFields(j, "c.json").no_unknown_keys({"a", "b"});
  EXPECT_THAT(st.message(), HasSubstr("unknown field 'typo' (known: a, b)"));
  EXPECT_FALSE(JsonFields(json::array(), "c.json").no_unknown_keys({"a"}).ok());
}

TEST(JsonFields, MissingKeysAreNamedAllAtOnce) {
  json j = {{"a", 1}};
  EXPECT_TRUE(JsonFields(j, "c.json").no_missing_keys({"a"}).ok());
  EXPECT_EQ(JsonFields(j, "c.json").no_missing_keys({"a", "b", "c"}).message(),
            "c.json: missing fields 'b', 'c'");
  EXPECT_EQ(JsonFields(j, "c.json").no_missing_keys({"b"}).message(), "c.json: missing field 'b'");
}

TEST(ReadJsonFile, ReportsMissingAndMalformedFiles) {
  EXPECT_EQ(read_json_file("/nonexistent/file.json").status().code(), StatusCode::kNotFound);
  test::TempDir dir;
  const std::string path = dir.file("crescent_json_util_test.json");
  std::ofstream(path) << "{\"a\": ";
  auto r = read_json_file(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not valid JSON"));
}

}  // namespace
}  // namespace crescent
