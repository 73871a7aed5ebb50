// `crescent profile --url` (docs/cost-model.md, "Profiling an engine over HTTP"): a model::ProfileTarget that
// times an OpenAI-compatible engine crescent does not own (vLLM, SGLang, crescent serve) through its HTTP
// API, so that a Conductor routing to that engine can predict its TTFT from a fitted perf::Profile.
//
// It times what a router sees, not the engine's iterations alone: a prefill's time includes the HTTP round
// trip (a new connection per request) and the engine's request handling and scheduling, which the fit puts
// into prefill_iteration_overhead_s; a decode step is the mean gap between the streamed tokens of concurrent
// requests. A mixed (chunked-prefill) iteration cannot be timed through the API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "model/profiler.h"

namespace crescent::serve {

struct HttpProfileOptions {
  /// The engine, "http://HOST:PORT" (a trailing "/" is allowed).
  std::string url;
  /// The served model's name, as GET /v1/models lists it; every request names it.
  std::string model;
  /// Sent as "Authorization: Bearer KEY" when not empty.
  std::string api_key;
  /// The engine's KV block size, tokens: cached prefixes must be multiples of it (engines cache whole
  /// blocks).
  int64_t block_size_tokens = 16;
  /// Prompt token ids are drawn from [0, vocab_size): at most the engine's vocabulary.
  int64_t vocab_size = 32000;
  /// max_tokens of each streamed request of a decode timing (>= 2).
  int64_t decode_output_tokens = 32;
  /// Seconds every HTTP call may take: connecting (at most 10 of them), each read, and a stream in all.
  double timeout_s = 120;
  /// Of the prompts' token ids. A run with the seed of an earlier run against the same engine would find
  /// that run's prompts in the engine's prefix cache: give each run its own (the CLI draws one).
  uint64_t seed = 1;
};

/// Checks that `options.url` answers GET /v1/models listing options.model, then returns a target timing it:
///   prefill_s(new, prefix): a fresh random prompt of prefix + new token ids (POST /v1/completions, a list of
///     ints, max_tokens 1, not streamed), its prefix sent alone first so the engine caches it; the second
///     request is timed end to end (send to whole answer). REQUIRES: prefix a multiple of block_size_tokens
///     (else kInvalidArgument).
///   decode_s(batch, context): `batch` fresh random prompts of `context` tokens, each sent alone first
///     (max_tokens 1) so that it is cached, then all streamed at once (stream, ignore_eos, max_tokens
///     decode_output_tokens), one thread each: the mean gap between consecutive token chunks after each
///     request's first, over the gaps while every request of the batch is decoding (from the last first
///     chunk to the first last chunk; all gaps after the first chunks when fewer than `batch` fall there).
///   mixed_s: kFailedPrecondition (profile with an empty ProfileGrid::chunk_tokens).
/// A timing's errors name the URL: kUnavailable when the engine cannot be reached or an exchange fails
/// (timeouts included), kInternal for a non-200 answer (its status and the start of its body) or an answer
/// that is not a completion. Not thread-safe (decode_s starts and joins its own threads).
/// Errors here: kInvalidArgument for a malformed URL or option; kUnavailable when the URL cannot be reached
/// or /v1/models does not answer 200 with a list (status and body excerpt); kNotFound when options.model is
/// not listed (the message names the URL and the models it serves).
Result<std::unique_ptr<model::ProfileTarget>> http_profile_target(const HttpProfileOptions& options);

}  // namespace crescent::serve
