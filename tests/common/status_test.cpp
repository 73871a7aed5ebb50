#include "common/status.h"

#include <gtest/gtest.h>

#include <string>

namespace crescent {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return Status::invalid_argument("must be > 0, got " + std::to_string(v));
  return v;
}

Status twice(int v) {
  CRESCENT_RETURN_IF_ERROR(parse_positive(v).status());
  return Status();
}

TEST(Status, OkAndErrorsCarryMessages) {
  EXPECT_TRUE(Status().ok());
  EXPECT_EQ(Status().to_string(), "OK");
  Status s = Status::not_found("no such preset");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "no such preset");
}

TEST(Result, HoldsValueOrStatus) {
  auto good = parse_positive(3);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  auto bad = parse_positive(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "must be > 0, got -1");
  EXPECT_TRUE(twice(2).ok());
  EXPECT_EQ(twice(0).message(), "must be > 0, got 0");
}

}  // namespace
}  // namespace crescent
