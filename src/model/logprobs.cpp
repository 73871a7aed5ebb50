#include "model/logprobs.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace crescent::model {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top) {
  assert(!logits.empty() && token >= 0 && static_cast<size_t>(token) < logits.size());
  assert(top >= 0 && top <= kMaxTopLogprobs);
  // The top list, by logit: an insert into a short sorted list, most values failing at its last entry.
  // Equal logits keep the lower id first (an equal value is inserted after those already there, and a full
  // list takes no value equal to its last).
  const auto wanted = static_cast<size_t>(std::min<int64_t>(top, std::ssize(logits)));
  std::vector<std::pair<int32_t, float>> best;
  best.reserve(wanted + 1);
  float max = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (v > max) max = v;
    if (wanted == 0 || (best.size() == wanted && !(v > best.back().second))) continue;
    auto at = std::upper_bound(best.begin(), best.end(), v,
                               [](float value, const auto& entry) { return value > entry.second; });
    best.insert(at, {static_cast<int32_t>(i), v});
    if (best.size() > wanted) best.pop_back();
  }
  // log Σ exp(logit), shifted by the max for range; in double, so the sum of a large vocabulary keeps its
  // precision.
  double sum = 0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double log_z = static_cast<double>(max) + std::log(sum);
  const auto logprob = [&](float v) { return static_cast<float>(static_cast<double>(v) - log_z); };
  TokenLogprobs out{.logprob = logprob(logits[static_cast<size_t>(token)])};
  out.top.reserve(best.size());
  for (const auto& [id, v] : best) out.top.emplace_back(id, logprob(v));
  return out;
}

}  // namespace crescent::model
