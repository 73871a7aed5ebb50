// `crescent profile` (issue 11 §4): times an executor's iterations over a grid of prefill (new tokens,
// cached prefix tokens) and decode (batch, context) points, fits perf::Profile's coefficients by weighted
// least squares (each point's residual relative to its time), and measures what chunked prefill costs on top
// of a whole-prompt prefill while a decode batch runs. The same code profiles the mock (whose iterations
// take the cost model's time: the fit must give back the cost model's own coefficients) and the cpu
// executor (whose iterations take what they take).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/llama_forward.h"
#include "perf/cost_model.h"
#include "perf/profile.h"

namespace crescent::model {

/// What is timed: one iteration of each kind, seconds. A timing that fails (the executor refuses the request,
/// an engine over HTTP does not answer) is an error, which ends the profile (profile_target returns it).
class ProfileTarget {
 public:
  virtual ~ProfileTarget() = default;
  /// One iteration prefilling `new_tokens` after `prefix_tokens` whose KV is cached.
  virtual Result<double> prefill_s(int64_t new_tokens, int64_t prefix_tokens) = 0;
  /// One decode step of `batch` requests holding `context_tokens` tokens each.
  virtual Result<double> decode_s(int64_t batch, int64_t context_tokens) = 0;
  /// One iteration decoding `batch` requests of `context_tokens` each and prefilling `new_tokens` after
  /// `prefix_tokens` (a colocated engine's chunked-prefill iteration). A target that cannot time such an
  /// iteration (an engine seen only through its API) returns kFailedPrecondition: profile it with an empty
  /// ProfileGrid::chunk_tokens, which skips the chunked-prefill measurement.
  virtual Result<double> mixed_s(int64_t batch, int64_t context_tokens, int64_t new_tokens,
                                 int64_t prefix_tokens) = 0;
};

/// The mock executor's iterations under `cost` (which must outlive the target): what the cost model says.
std::unique_ptr<ProfileTarget> mock_profile_target(const perf::CostModel& cost);
/// The cpu executor's iterations on `model` (which must outlive the target) with KV in blocks of
/// `block_size_tokens`, `capacity_blocks` of them. Cached prefixes are imported blocks (their contents do
/// not change the time), so prefix sizes must be multiples of the block size.
std::unique_ptr<ProfileTarget> cpu_profile_target(LlamaForward& model, int64_t block_size_tokens,
                                                  int64_t capacity_blocks);

/// What a ProfileNeighbour runs back to back beside the timed iterations.
enum class NeighbourWork { kIdle, kPrefill, kDecode };

/// A second executor computing beside the timed one, on a core of its own, so each point is timed as an
/// instance that shares this host's memory system with an instance of the other role is timed (a prefill
/// and a decode instance on one machine: `crescent profile --neighbour-core`, docs/serving.md, "The
/// simulator predicts the live cpu cluster"). profile_target runs it with prefill beside the decode points
/// and decode beside the prefill points, and idle beside the chunked-prefill measurement (a colocated
/// engine's). Thread-safe.
class ProfileNeighbour {
 public:
  virtual ~ProfileNeighbour() = default;
  /// From now on the neighbour runs `work` back to back (kIdle: nothing); returns once it has begun (its
  /// first such iteration is under way).
  virtual void set_work(NeighbourWork work) = 0;
  /// Iterations it has finished so far (of either kind).
  virtual int64_t iterations() const = 0;
  /// Why its iterations stopped: the first one that failed (it then stays idle until set_work), or ok.
  virtual Status status() const = 0;
};

/// A neighbour running `model`'s iterations on a LlamaForward of its own (its own copy of the weights, as
/// another process would have) on one thread pinned to `core`, one compute thread: prefill iterations of
/// `prefill_tokens` new tokens, or decode steps of one request holding `decode_context_tokens` tokens.
/// `model` may be destroyed afterwards. Errors: kInvalidArgument when the thread cannot run on `core`.
Result<std::unique_ptr<ProfileNeighbour>> cpu_profile_neighbour(const LlamaModel& model, int core,
                                                                int64_t block_size_tokens,
                                                                int64_t prefill_tokens,
                                                                int64_t decode_context_tokens);

/// The grid and how often each point is timed.
struct ProfileGrid {
  std::vector<int64_t> prefill_tokens = {128, 256, 512, 1024};
  std::vector<int64_t> prefix_tokens = {0, 512, 1024};
  std::vector<int64_t> decode_batch = {1, 2, 4, 8, 16};
  std::vector<int64_t> decode_context = {128, 512, 1024};
  int64_t chunked_prompt_tokens = 1024;  // the prompt prefilled whole and in chunks
  /// Empty: no chunked-prefill measurement (ProfileReport::chunked stays empty), for targets whose mixed_s
  /// cannot be timed.
  std::vector<int64_t> chunk_tokens = {64, 128, 256, 512};
  int64_t chunked_decode_batch = 4;  // running beside it, each of chunked_decode_context tokens
  int64_t chunked_decode_context = 512;
  int repeats = 3;  // each point's time is the median of this many
};

/// One timed point and what the fitted profile says of it.
struct ProfilePoint {
  std::string kind;  // "prefill" or "decode"
  int64_t a = 0;     // prefill: new tokens; decode: batch
  int64_t b = 0;     // prefill: prefix tokens; decode: context tokens per request
  double measured_s = 0;
  double fitted_s = 0;
};

/// The chunked-prefill measurement for one chunk size: the prompt whole in one iteration (which also decodes
/// the batch once) against its chunks, each iteration also decoding the batch; measured, and as the fitted
/// profile's cost model predicts (its prefill_iteration_overhead_s is what each extra iteration costs beyond
/// its compute and reads).
struct ChunkedPrefill {
  int64_t chunk_tokens = 0;
  int64_t chunks = 0;
  double whole_s = 0;
  double chunked_s = 0;
  double predicted_whole_s = 0;
  double predicted_chunked_s = 0;
};

struct ProfileReport {
  perf::Profile profile;
  std::vector<ProfilePoint> points;
  double prefill_rms_relative = 0;  // sqrt(mean((fitted - measured)² / measured²)) over the prefill points
  double decode_rms_relative = 0;
  std::vector<ChunkedPrefill> chunked;
};

/// Times `target` over `grid` and fits the profile (`source` names it), with `neighbour` (if not null)
/// computing beside it as ProfileNeighbour says (left idle on return). `progress` (may be empty) hears one
/// line per stage. Errors: kInvalidArgument for an empty or non-positive grid; the first failed timing of
/// `target` or `neighbour` (ProfileNeighbour::status), as it said.
Result<ProfileReport> profile_target(ProfileTarget& target, const ProfileGrid& grid,
                                     const std::string& source,
                                     const std::function<void(const std::string&)>& progress = {},
                                     ProfileNeighbour* neighbour = nullptr);

/// The report as JSON: the profile's fields at the top level (what --profile reads), then "points",
/// "residuals" and "chunked_prefill".
/// Decode points the fitted prefill coefficients call compute-bound (measured within 2% of
/// batch × linear + context × attention) do not enter the decode (memory) fit, as the roofline's max() says.
nlohmann::json to_json(const ProfileReport& report);

}  // namespace crescent::model
