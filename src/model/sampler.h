// Choosing the next token from a row of logits (issue 11): greedy, or a draw at a temperature from the
// top-p nucleus, with a seeded generator: the same seed and logits give the same tokens on any machine.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"

namespace crescent::model {

/// How a request samples (OpenAI's temperature, top_p and seed).
struct SamplingParams {
  double temperature = 0;  // 0: greedy (argmax); else logits are divided by it before the softmax
  double top_p = 1;        // keep the most likely tokens whose probabilities sum to at least this, (0, 1]
  uint64_t seed = 0;       // the draws' generator
  /// Tokens this request sampled before, elsewhere (a stream moved off an instance that went down): a
  /// sampler at a temperature skips their draws, so it goes on with the draws an undisturbed run makes.
  /// >= 0.
  int64_t tokens_before = 0;
};

/// kInvalidArgument naming the field unless temperature is finite and in [0, 2] and top_p in (0, 1] (the
/// OpenAI API's ranges), and tokens_before >= 0.
Status validate(const SamplingParams& params);

/// One request's sampler: its generator advances by one draw per sampled token (none when greedy).
class Sampler {
 public:
  /// REQUIRES: validate(params) is ok.
  explicit Sampler(const SamplingParams& params);
  /// The next token from `logits` (vocab_size floats, not empty). Greedy: the first index of the largest
  /// logit. Otherwise p = softmax(logits / temperature) (in double), the tokens sorted by p (ties by index),
  /// the shortest prefix whose p sums to >= top_p kept, and one of them drawn in proportion to p.
  int32_t sample(std::span<const float> logits);
  /// Advances the generator past `draws` draws (a sampler resuming where another left off).
  void discard(uint64_t draws) { rng_.discard(draws); }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<double, int32_t>> scratch_;  // (p, token)
};

}  // namespace crescent::model
