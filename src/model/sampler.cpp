#include "model/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>

namespace crescent::model {

Status validate(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0 || params.temperature > 2) {
    return Status::invalid_argument(
        fmt::format("'temperature' must be between 0 and 2, got {}", params.temperature));
  }
  if (!std::isfinite(params.top_p) || params.top_p <= 0 || params.top_p > 1) {
    return Status::invalid_argument(fmt::format("'top_p' must be in (0, 1], got {}", params.top_p));
  }
  if (params.tokens_before < 0) {
    return Status::invalid_argument(
        fmt::format("'tokens_before' must be >= 0, got {}", params.tokens_before));
  }
  return Status::ok_status();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  assert(validate(params).ok());
  if (params.temperature > 0) rng_.discard(static_cast<uint64_t>(params.tokens_before));
}

int32_t Sampler::sample(std::span<const float> logits) {
  assert(!logits.empty());
  const auto argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (params_.temperature == 0) return argmax;
  const double max = logits[static_cast<size_t>(argmax)];
  scratch_.resize(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp((static_cast<double>(logits[i]) - max) / params_.temperature);
    scratch_[i] = {p, static_cast<int32_t>(i)};
    sum += p;
  }
  std::sort(scratch_.begin(), scratch_.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  size_t kept = 0;
  double kept_mass = 0;
  while (kept < scratch_.size() && (kept == 0 || kept_mass < params_.top_p * sum)) {
    kept_mass += scratch_[kept++].first;
  }
  // A uniform draw in [0, kept_mass) from the generator's top 53 bits (the same on every platform, unlike
  // std::uniform_real_distribution).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept_mass;
  double acc = 0;
  for (size_t i = 0; i < kept; ++i) {
    acc += scratch_[i].first;
    if (u < acc) return scratch_[i].second;
  }
  return scratch_[kept - 1].second;
}

}  // namespace crescent::model
