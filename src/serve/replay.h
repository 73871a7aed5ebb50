// Trace replay against any OpenAI-compatible server (docs/serving.md, "`crescent replay`"): each request of a
// Mooncake trace is sent at its timestamp / time_scale as a streamed /v1/completions with a token-id prompt
// built from its hash_ids (same id → same tokens, exactly input_length of them), max_tokens = output_length
// and ignore_eos; TTFT, token gaps, end-to-end latency, prefix hits (usage.prompt_tokens_details) and
// refusals are measured per request, into the simulator's result type so the report is the simulator's.
// One thread sends each request at its time; one event loop thread (HttpClient) holds every connection and
// reads every stream, so thousands of streams may be in flight (docs/serving.md, "A client that keeps up").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cluster/run_result.h"
#include "common/status.h"
#include "trace/request.h"

namespace crescent::serve {

/// The prompt of `request`: for each hash id, `block_size_tokens` token ids in [0, vocab_size) drawn from
/// xxh3(id, position), joined and cut to exactly input_tokens. REQUIRES: vocab_size >= 1.
std::vector<int64_t> trace_prompt_tokens(const trace::Request& request, int64_t block_size_tokens,
                                         int64_t vocab_size);

/// An OpenAI-compatible server to send requests to.
struct ServerAddress {
  std::string host = "127.0.0.1";
  int port = 8000;
};

struct ReplayOptions {
  /// Request i goes to servers[i % size]; one whose connection cannot be made (nothing was sent) is tried at
  /// the next server, each at most once. The model list and /metrics come from the first. REQUIRES: not
  /// empty.
  std::vector<ServerAddress> servers = {ServerAddress{}};
  std::string model;    // the model to name; empty: the first one GET /v1/models lists
  std::string api_key;  // sent as a Bearer token when set
  double time_scale = 1.0;
  int64_t block_size_tokens = 512;
  int64_t vocab_size = 256;  // token ids stay below this (the server's vocabulary)
  /// A request not answered in full within this many seconds of being sent fails (whatever the server
  /// trickles meanwhile).
  double timeout_s = 600;
  /// A stream failing its request: an event (an SSE line) longer than this many bytes, or more token chunks
  /// than max_tokens + this many.
  size_t max_event_bytes = 1 << 20;
  int64_t extra_chunks_allowed = 8;
  /// Sends each request a seed (its trace line) and checks the answer's text is exactly what a crescent
  /// instance running the mock executor says for that seed (engine::mock_token): a mismatch is a failure of
  /// class kWrongOutput. For servers of crescent's mock model only.
  bool check_mock_output = false;
  /// Called as requests finish (on the client's event loop thread): finished so far, total.
  std::function<void(int64_t finished, int64_t total)> progress = nullptr;
};

/// How a failed request ended, for telling a clean ending (a client knows at once that it failed) from one a
/// server must never give (docs/serving.md, "A chaos run").
enum class FailureClass {
  kHung,               // no whole answer within timeout_s
  kHttpError,          // an HTTP error status other than a refusal (e.g. 503, 500, a 400 not for length)
  kSseError,           // the stream ended with an error event
  kConnectionClosed,   // the connection closed before the answer's end ([DONE])
  kConnectionRefused,  // no server could be connected to: nothing was sent
  kMalformed,          // a stream event that is not JSON, of an unexpected shape or size, or too many tokens
  kWrongOutput,        // a complete answer whose text is not the mock model's (check_mock_output)
};
inline constexpr int kFailureClasses = 7;
/// "hung", "http_error", "sse_error", "connection_closed", "connection_refused", "malformed",
/// "wrong_output".
const char* to_string(FailureClass c);

/// What a replay measured. `result` follows cluster::RunResult: times in seconds from the first send; a
/// refused request (HTTP 429, or 400 for a prompt that can never fit) is rejected with the server's reason
/// when it names one (error.code "ttft", "tbt", "decode-capacity", "context-length"), else kTtft for a 429;
/// any other ending is a failure (RequestOutcome::failed), never a refusal.
struct ReplayResult {
  cluster::RunResult result;
  std::string model;
  int64_t failed =
      0;  // requests that neither completed nor were refused (no answer in time, 5xx, bad stream)
  std::string first_error;  // the first such failure, for the report
  /// Failed requests by FailureClass (indexed by its value); they add up to `failed`.
  std::array<int64_t, kFailureClasses> failures{};
  /// A crescent server's mean exposed KV transfer over the replay's requests (from its /metrics,
  /// crescent_kv_exposed_transfer_seconds: prefill end to KV all at decode); nullopt from other servers.
  std::optional<double> kv_exposed_transfer_mean_s;
  /// How late requests were sent against their schedule (arrival / time_scale), seconds: the replay's own
  /// lag, which says whether the client kept up (every request is sent by one thread, every stream read by
  /// one event loop thread).
  double schedule_lag_mean_s = 0;
  double schedule_lag_p99_s = 0;
  double schedule_lag_max_s = 0;
  int64_t max_in_flight = 0;  // the most requests sent and not yet finished at once
};

/// Replays `trace`. Errors: kUnavailable when the server cannot be reached or lists no model (before any
/// request is sent); kInvalidArgument for bad options. Individual request failures are counted, not errors.
Result<ReplayResult> replay(std::span<const trace::Request> trace, const ReplayOptions& options);

}  // namespace crescent::serve
