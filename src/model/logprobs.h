// Log-probabilities of generated tokens (OpenAI's `logprobs` / `top_logprobs`, issue 22 §5): the
// log-softmax of the model's raw logits at a generated position, before temperature and top-p (as vLLM
// returns them by default), for the sampled token and the most likely ones.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace crescent::model {

/// A request's logprobs setting where an int carries it: no logprobs (the default: nothing is computed).
inline constexpr int32_t kNoLogprobs = -1;
/// The most alternatives a request may ask for per token (OpenAI's limit, and vLLM's default).
inline constexpr int32_t kMaxTopLogprobs = 20;

/// The logprobs of one generated token. Natural logarithms, <= 0.
struct TokenLogprobs {
  float logprob = 0;  // the sampled token's
  /// The most likely tokens with their logprobs, most likely first (equal logits: lower id first, so a
  /// greedy token, the first index of the largest logit, is top[0]); as many as were asked, at most the
  /// vocabulary. The sampled token's entry, when it is here, equals `logprob` exactly.
  std::vector<std::pair<int32_t, float>> top = {};

  bool operator==(const TokenLogprobs&) const = default;
};

/// The logprobs at one position: log_softmax(`logits`) (computed in double: logit - max - log Σ exp(logit -
/// max)) of `token` and of the `top` most likely tokens. O(vocab) with a `top`-long sorted insert list.
/// REQUIRES: `logits` not empty and finite, 0 <= token < logits.size(), 0 <= top <= kMaxTopLogprobs.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top);

}  // namespace crescent::model
