#include "router/engine_body.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <string_view>
#include <vector>

namespace crescent::router {
namespace {

using nlohmann::json;

// Room for a body's members but its prompt's ids, reserved with them (the string grows if they need more).
constexpr size_t kBodyMembersBytes = 1024;

void append_dump(std::string& out, const json& value) {
  out += value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// `ids` as a JSON array of integers, as nlohmann dumps one, written in this thread's scratch buffer (room
// for the widest ids, 21 characters each, kept from request to request) and returned as a view of it, valid
// until the thread's next call. The body is then allocated at its exact size: sizing it for the widest ids
// (~180 KB for a 32 KB prompt's, where ~50 KB are written) made the allocator map fresh pages from the
// kernel for every request, a page fault per 4 KiB (docs/benchmarks.md "Router mode").
std::string_view ids_json(const std::vector<int64_t>& ids) {
  thread_local std::vector<char> scratch;
  const size_t bound = 2 + 21 * ids.size();
  if (scratch.size() < bound) scratch.resize(bound);
  char* const begin = scratch.data();
  char* p = begin;
  char* const end = begin + bound;
  *p++ = '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) *p++ = ',';
    p = std::to_chars(p, end, ids[i]).ptr;
  }
  *p++ = ']';
  return {begin, static_cast<size_t>(p - begin)};
}

}  // namespace

std::string engine_body(const serve::RelayedRequest& request, bool token_ids, bool prefill_step,
                        const json* kv_transfer_params) {
  const bool ids_prompt = request.endpoint == serve::Endpoint::kCompletions && token_ids;
  // The members replaced or added (a small object: its keys sorted as the body's are), and those dropped.
  json changes = json::object();
  std::array<std::string_view, 3> dropped{};
  if (ids_prompt) changes["prompt"] = nullptr;  // written from prompt_token_ids below
  if (prefill_step) {
    changes["kv_transfer_params"] = {{"do_remote_decode", true},    {"do_remote_prefill", false},
                                     {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                     {"remote_host", nullptr},      {"remote_port", nullptr}};
    changes["stream"] = false;
    changes["max_tokens"] = 1;
    if (request.body.contains("max_completion_tokens")) changes["max_completion_tokens"] = 1;
    dropped = {"stream_options", "min_tokens", "min_completion_tokens"};
  } else if (kv_transfer_params != nullptr) {
    changes["kv_transfer_params"] = *kv_transfer_params;
  }
  if (!request.body.is_object()) {  // not a request the front end passes on; edited as a tree all the same
    json body = request.body;
    for (auto& [key, value] : changes.items()) body[key] = value;
    if (ids_prompt) body["prompt"] = request.prompt_token_ids;
    for (std::string_view key : dropped)
      if (!key.empty()) body.erase(std::string(key));
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  // The body's members and the changes merged in key order (both std::map: the order nlohmann dumps in).
  const std::string_view ids_text = ids_prompt ? ids_json(request.prompt_token_ids) : std::string_view();
  std::string out;
  // A text prompt (or chat messages) is written as the client sent it: ~4 bytes a token, a guess (the string
  // grows past it if need be).
  out.reserve(kBodyMembersBytes + (ids_prompt ? ids_text.size() : 4 * request.prompt_token_ids.size()));
  out += '{';
  bool first = true;
  const auto member = [&](const std::string& key, const json& value) {
    if (!first) out += ',';
    first = false;
    append_dump(out, json(key));
    out += ':';
    if (ids_prompt && key == "prompt") {
      out += ids_text;
    } else {
      append_dump(out, value);
    }
  };
  const auto& body = request.body.get_ref<const json::object_t&>();
  const auto& edits = changes.get_ref<const json::object_t&>();
  auto b = body.begin();
  auto c = edits.begin();
  while (b != body.end() || c != edits.end()) {
    if (c == edits.end() || (b != body.end() && b->first < c->first)) {
      if (std::find(dropped.begin(), dropped.end(), std::string_view(b->first)) == dropped.end()) {
        member(b->first, b->second);
      }
      ++b;
    } else {
      if (b != body.end() && b->first == c->first) ++b;  // replaced
      member(c->first, c->second);
      ++c;
    }
  }
  out += '}';
  return out;
}

}  // namespace crescent::router
