#include "trace/writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "test_support/temp_dir.h"
#include "trace/reader.h"

namespace crescent::trace {
namespace {

namespace fs = std::filesystem;

TEST(TraceWriter, WhatItWritesReadsBackAndAppearsOnlyOnCommit) {
  test::TempDir dir;
  const std::string path = (fs::path(dir.path()) / "out.jsonl").string();
  std::vector<Request> requests(3);
  requests[0] = {.timestamp_ms = 0, .input_tokens = 700, .output_tokens = 5, .block_keys = {1, 2}};
  requests[1] = {.timestamp_ms = 40, .input_tokens = 512, .output_tokens = 1, .block_keys = {1}};
  requests[2] = {
      .timestamp_ms = 40, .input_tokens = 3, .output_tokens = 9, .block_keys = {18446744073709551615ull}};
  requests[2].session_id = 7;
  requests[2].token_ids = {5, 6, 7};
  {
    auto writer = TraceWriter::open(path);
    ASSERT_TRUE(writer.ok()) << writer.status().message();
    for (const Request& request : requests) ASSERT_TRUE((*writer)->append(request).ok());
    EXPECT_FALSE(fs::exists(path));
    ASSERT_TRUE((*writer)->commit().ok());
    EXPECT_EQ((*writer)->requests(), 3);
  }
  EXPECT_EQ(format_trace_line(requests[2]),
            R"({"timestamp":40,"input_length":3,"output_length":9,"hash_ids":[18446744073709551615],)"
            R"("session_id":7,"token_ids":[5,6,7]})"
            "\n");
  auto read = read_trace(path, ReadOptions{});
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(read->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*read)[i].timestamp_ms, requests[i].timestamp_ms);
    EXPECT_EQ((*read)[i].input_tokens, requests[i].input_tokens);
    EXPECT_EQ((*read)[i].output_tokens, requests[i].output_tokens);
    EXPECT_EQ((*read)[i].block_keys, requests[i].block_keys);
  }
}

TEST(TraceWriter, AWriterNotCommittedLeavesNothingBehind) {
  test::TempDir dir;
  const std::string path = (fs::path(dir.path()) / "out.jsonl").string();
  {
    auto writer = TraceWriter::open(path);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(
        (*writer)
            ->append(Request{.timestamp_ms = 1, .input_tokens = 1, .output_tokens = 1, .block_keys = {3}})
            .ok());
  }
  EXPECT_TRUE(fs::is_empty(fs::path(dir.path())));
  EXPECT_FALSE(TraceWriter::open((fs::path(dir.path()) / "missing" / "out.jsonl").string()).ok());
}

}  // namespace
}  // namespace crescent::trace
