// End times of a decode engine's token-producing steps, and the TBT of a request read off them (used by
// EngineCore, engine_core.h).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace crescent::engine {

/// A request's TBT from its token gaps (seconds, in any order; at least one): paper §5.1's mean of the
/// longest 10% (at least one gap), and the longest gap. Reorders `gaps`.
struct TokenGaps {
  double tbt_s = 0;
  double max_gap_s = 0;
};
inline TokenGaps tbt_of_gaps(std::span<double> gaps) {
  const auto k = static_cast<std::ptrdiff_t>(std::max<size_t>(1, (gaps.size() + 9) / 10));
  std::nth_element(gaps.begin(), gaps.begin() + (k - 1), gaps.end(), std::greater<>());
  double sum = 0, longest = 0;
  for (std::ptrdiff_t i = 0; i < k; ++i) {
    sum += gaps[i];
    longest = std::max(longest, gaps[i]);
  }
  return {sum / static_cast<double>(k), longest};
}

/// End times of one engine's decode steps (iterations in which every running request gains a token), numbered
/// from 0, and the TBT of a request read off them, so no step has to touch every request in the batch. The
/// owner trims it below the oldest request still decoding: memory stays proportional to the longest request.
class StepLog {
 public:
  // Number of the next step to be appended.
  int64_t next_step() const { return base_ + static_cast<int64_t>(end_s_.size()); }
  void append(double end_s) { end_s_.push_back(end_s); }
  // Starts loading where the next append writes.
  [[gnu::always_inline]] void prefetch_next() const { __builtin_prefetch(end_s_.data() + end_s_.size(), 1); }

  // Forgets the steps before `step`, once that frees over 4096 steps and half the log (amortised O(1)).
  void trim_before(int64_t step) {
    const auto drop = static_cast<size_t>(step - base_);
    if (drop > 4096 && drop * 2 > end_s_.size()) {
      end_s_.erase(end_s_.begin(), end_s_.begin() + static_cast<ptrdiff_t>(drop));
      base_ = step;
    }
  }

  // The token gaps of a request whose first token came at `first_token_s` and that decoded in steps
  // [join_step, last_step] (at least one gap): its TBT (paper §5.1: the mean of its longest 10% gaps) and
  // its longest gap.
  using Gaps = TokenGaps;
  Gaps gaps(double first_token_s, int64_t join_step, int64_t last_step) {
    // Differences of adjacent end times, in a loop the compiler vectorizes; the scratch only grows, so
    // nothing is zeroed per request.
    assert(join_step >= base_ && last_step >= join_step && last_step < next_step());
    const auto count = static_cast<size_t>(last_step - join_step + 1);
    if (gaps_.size() < count) gaps_.resize(count);
    const double* end = end_s_.data() + (join_step - base_);
    double* gap = gaps_.data();
    gap[0] = end[0] - first_token_s;
    for (size_t i = 1; i < count; ++i) gap[i] = end[i] - end[i - 1];
    return tbt_of_gaps({gap, count});
  }

 private:
  double end_s(int64_t step) const { return end_s_[static_cast<size_t>(step - base_)]; }

  std::vector<double> end_s_;  // end of step base_ + i
  int64_t base_ = 0;
  std::vector<double> gaps_;  // scratch for tbt_s
};

}  // namespace crescent::engine
