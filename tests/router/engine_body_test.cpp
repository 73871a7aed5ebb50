// The body an engine gets (router/engine_body.h) against the way router.cpp built it before it was written
// directly: the client's body edited as a JSON tree, then dumped. Byte for byte the same over bodies of both
// endpoints, with and without token ids, in each step of a disaggregated request, with keys sorting before
// and after the ones edited, and strings that need escaping.
#include "router/engine_body.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace crescent::router {
namespace {

using nlohmann::json;

// router.cpp's engine_body before (commit 26628d3).
std::string edited_tree(const serve::RelayedRequest& request, bool token_ids, bool prefill_step,
                        const json* kv_transfer_params) {
  json body = request.body;
  if (request.endpoint == serve::Endpoint::kCompletions && token_ids)
    body["prompt"] = request.prompt_token_ids;
  if (prefill_step) {
    body["kv_transfer_params"] = {{"do_remote_decode", true},    {"do_remote_prefill", false},
                                  {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                  {"remote_host", nullptr},      {"remote_port", nullptr}};
    body["stream"] = false;
    body["max_tokens"] = 1;
    if (body.contains("max_completion_tokens")) body["max_completion_tokens"] = 1;
    body.erase("stream_options");
    body.erase("min_tokens");
    body.erase("min_completion_tokens");
  } else if (kv_transfer_params != nullptr) {
    body["kv_transfer_params"] = *kv_transfer_params;
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST(EngineBody, IsTheEditedBodyDumped) {
  const std::vector<json> bodies = {
      {{"model", "m"}, {"prompt", "Hello \"world\"\n\u00e9\U0001F600"}, {"max_tokens", 4}, {"stream", true}},
      {{"model", "m"},
       {"prompt", "x"},
       {"stream", true},
       {"stream_options", {{"include_usage", true}}},
       {"min_tokens", 2},
       {"max_completion_tokens", 9},
       {"temperature", 0.5},
       {"a", nullptr},
       {"zz", {1, 2}}},
      {{"model", "m"}, {"prompt", {1, 2, 3}}, {"kv_transfer_params", {{"old", 1}}}, {"seed", -5}},
      {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi\t\u0001"}}}}, {"max_tokens", 3}},
      {{"model", "m"}},
      json::object()};
  const json params = {{"remote_engine_id", "e1"}, {"remote_block_ids", {4, 5}}, {"remote_host", "10.0.0.1"}};
  std::mt19937_64 rng(3);
  size_t compared = 0;
  for (const json& body : bodies) {
    for (auto endpoint : {serve::Endpoint::kCompletions, serve::Endpoint::kChatCompletions}) {
      serve::RelayedRequest request;
      request.endpoint = endpoint;
      request.body = body;
      for (size_t i = 0, n = rng() % 50; i < n; ++i)
        request.prompt_token_ids.push_back(static_cast<int64_t>(rng() % 200000));
      for (bool token_ids : {true, false}) {
        for (int step = 0; step < 3; ++step) {  // prefill; decode with params; a colocated engine (neither)
          const bool prefill = step == 0;
          const json* kv = step == 1 ? &params : nullptr;
          EXPECT_EQ(engine_body(request, token_ids, prefill, kv),
                    edited_tree(request, token_ids, prefill, kv))
              << body.dump() << " token_ids " << token_ids << " step " << step;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, bodies.size() * 2 * 2 * 3);
}

TEST(EngineBody, WritesNoIdsAndOneId) {
  serve::RelayedRequest request;
  request.body = {{"model", "m"}, {"prompt", "x"}};
  EXPECT_EQ(engine_body(request, true, false, nullptr), edited_tree(request, true, false, nullptr));
  request.prompt_token_ids = {7};
  EXPECT_EQ(engine_body(request, true, false, nullptr), edited_tree(request, true, false, nullptr));
}

TEST(EngineBody, WritesLongTokenIdPrompts) {
  serve::RelayedRequest request;
  request.body = {{"model", "m"}, {"prompt", std::string(32768, 'a')}, {"max_tokens", 4}, {"stream", true}};
  for (int64_t i = 0; i < 8000; ++i) request.prompt_token_ids.push_back(i * 16 + (i % 7) * 100000);
  request.prompt_token_ids.push_back(0);
  request.prompt_token_ids.push_back(INT64_MAX);
  // Not ids an engine takes, but the body is written as exactly as their width is counted.
  for (int64_t id :
       {int64_t{-1}, int64_t{-10}, int64_t{-99}, int64_t{9}, int64_t{10}, INT64_MIN + 1, INT64_MIN})
    request.prompt_token_ids.push_back(id);
  for (int64_t p = 1; p <= INT64_MAX / 10; p *= 10) {  // each width's edges
    for (int64_t id : {p - 1, p, p + 1, -p}) request.prompt_token_ids.push_back(id);
  }
  EXPECT_EQ(engine_body(request, true, false, nullptr), edited_tree(request, true, false, nullptr));
}

}  // namespace
}  // namespace crescent::router
