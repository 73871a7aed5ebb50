// A cluster's config, the one the simulator and the live server are both built from: model, hardware, pool
// sizes, cache capacities, scheduler knobs and SLOs, and how `crescent serve` runs it; loaded from a
// configs/*.json file (docs/config.md describes every field). The one place a config becomes Conductor and
// engine options.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "conductor/conductor.h"
#include "engine/engine_core.h"
#include "perf/cost_model.h"
#include "perf/hardware_spec.h"
#include "perf/model_spec.h"
#include "perf/profile.h"

namespace crescent::cluster {

/// Service-level objectives a request is judged against (paper §5.1).
struct SloConfig {
  double ttft_s = 30.0;                      // time to first token
  std::vector<double> tbt_s{0.1, 0.2, 0.3};  // TBT thresholds; the first is the primary one
};

/// What computes a live instance's iterations.
enum class ExecutorKind {
  kMock,  // the cost model's time, no compute (engine::MockExecutor)
  kCpu,   // the model computed on this machine's CPUs (model::CpuExecutor); needs a model directory
};
/// Parses "mock", "cpu"; the error (kNotFound) lists the valid names.
Result<ExecutorKind> parse_executor(std::string_view name);
/// The name of `executor`, as parse_executor() reads it.
std::string_view to_string(ExecutorKind executor);
/// Every executor's name, in the order above.
std::vector<std::string> executor_names();

/// How `crescent serve` runs the config's instances as processes; the simulator ignores it. Names are parsed
/// into enums at load (errors list the valid names); flags given on the command line win.
struct ServeConfig {
  /// KV bytes really moved and stored = the model's KV bytes / this, so a run fits this machine's memory
  /// (LLaMA3-70B's 320 KiB per token becomes 80 bytes at 4096).
  int64_t kv_bytes_scale = 4096;
  double kv_transfer_timeout_s = 5;  // decode frees a reservation whose KV has not arrived by then
  double heartbeat_timeout_s = 3;    // an instance that sent nothing for this long is down
  /// A request's stages (queued, prefilling, shipping its KV to decode, decoding) each have a deadline of
  /// stage_timeout_floor_s + stage_timeout_factor x the stage's predicted time, counted from the stage's
  /// start (decoding: from its last token); past it the request fails (an instance that heartbeats but never
  /// answers must not hang it). docs/serving.md says why these defaults. Both > 0.
  double stage_timeout_floor_s = 30;
  double stage_timeout_factor = 4;
  /// How many times a request may be placed (its first placement included): the requests of an instance
  /// that goes down are placed again on others (a stream with tokens out goes on from them), up to this many
  /// placements in all, then fail with instance_down. >= 1 (1: never placed again).
  int64_t max_request_placements = 3;
  /// KV event batches a prefill instance keeps for a subscriber that missed them (replay, kv_events.h). A
  /// Conductor that starts or loses track later learns an instance's whole cache from its full report
  /// instead (docs/serving.md). >= 1.
  int64_t kv_event_buffer_batches = 10'000;
  int64_t store_dram_bytes = 256ll << 20;  // DRAM of the store node `crescent serve` starts
  /// An SSD tier behind that node, in RUN_DIR/store-ssd (0: none). It outlives the node, and a restarted
  /// node (or a `crescent serve` started again on the same --run-dir) adopts it (docs/store.md).
  int64_t store_ssd_bytes = 0;
  /// Each prefill instance `crescent serve` starts keeps its prefix cache in a file in /dev/shm too, so an
  /// instance restarted by the supervisor keeps it (kv/persistent_block_file.h). The cpu executor's KV is
  /// then held twice (its memory and the file); the mock keeps keys only.
  bool keep_prefill_cache = false;
  bool verify_kv_checksums = true;  // decode checks the checksum of every KV block it receives
  /// The cpu executor's prefill instances ship each layer's KV of a chunk as it is computed (paper §3.1
  /// step 3); false: each chunk whole once its iteration ends (what the exposed transfer is measured against;
  /// the simulator always charges layer by layer).
  bool kv_stream_layers = true;
  conductor::PrefillPolicy policy = conductor::PrefillPolicy::kGlobalCacheAware;  // --policy wins
  conductor::Admission admission = conductor::Admission::kNone;                   // --admission wins
  int64_t http_port = 8000;                     // the Conductor's HTTP port (0: any free one); --port wins
  ExecutorKind executor = ExecutorKind::kMock;  // --executor wins
  /// With executor "cpu": the model directory (config.json + model.safetensors); --model wins. The model
  /// then replaces the config's "model" (its KV bytes per token are what moves, unscaled).
  std::string model_dir;
  /// With executor "cpu": bytes of KV an instance may hold (its cache and its transfer buffers); 0: half of
  /// the memory this machine has available, shared by the instances it runs, less their weights
  /// (serve_options.h). --kv-cache-bytes wins. It bounds prefill_cache_capacity_tokens and the decode
  /// instances' KV capacity.
  int64_t kv_cache_bytes = 0;
  /// The most tokens one request may have (prompt + max_tokens), as vLLM's max model length: longer ones
  /// are refused with 400 before anything is reserved. 0: the model's context (the cpu executor's model) or
  /// no limit of its own (the mock). max_context_tokens (conductor_core.h) also applies the share below.
  int64_t max_model_len_tokens = 0;
  /// The largest share of a decode instance's KV capacity one request may reserve (prompt + max_tokens are
  /// reserved up front and crescent does not preempt): at 0.25 it takes four requests at the limit to fill an
  /// instance, never one or two (issue 22 §3: two requests near the whole context had every other one wait
  /// for hours). In (0, 1].
  double max_request_kv_share = 0.25;
};

/// Everything the simulator and a live cluster need to know about the cluster. docs/config.md describes every
/// field (type, unit, default, range, source); cluster_config_fields() lists their JSON names.
struct ClusterConfig {
  std::string name;         // for reports (the file's stem when loaded from a file)
  std::string description;  // free text for people; no effect
  perf::ModelSpec model;
  perf::HardwareSpec hardware;  // one instance (node); its network_bytes_per_s times KV transfers
  uint32_t prefill_instances = 8;
  uint32_t decode_instances = 8;
  int64_t prefill_cache_capacity_tokens = 3'000'000;  // DRAM prefix cache of each prefill instance
  double decode_hbm_reserved_share = 0.1;  // HBM kept free of weights and KV (activations, fragmentation)
  /// A decode instance's KV capacity (tokens) when the memory it has is not the hardware's HBM (the cpu
  /// executor on this machine: crescent serve sets it from the KV cache budget); 0: from the HBM
  /// (decode_kv_capacity_tokens()).
  int64_t decode_kv_capacity_tokens = 0;
  int64_t prefill_chunk_tokens =
      8192;  // a prefill instance's iteration; KV streams to decode after each (§3.1)
  double kvcache_balancing_threshold = 1.0;  // Algorithm 1 line 5
  /// Output length (tokens) admission assumes before any request has finished; then a running mean of
  /// finished requests' outputs takes over (conductor::OutputLengthEstimator).
  double expected_output_prior_tokens = 256;
  SloConfig slo;
  uint64_t seed = 1;
  ServeConfig serve;  // "serve": live runs only (not echoed by to_json, which reports what simulations use)
  /// "profile": measured cost-model coefficients (`crescent profile`; a file relative to the config, or the
  /// object), used instead of the roofline's everywhere a CostModel is built (cost_model()). --profile wins.
  std::optional<perf::Profile> profile;
};

/// The cost model of `config`: its model and hardware, and its profile when it has one. Every simulated or
/// live component builds its CostModel here.
perf::CostModel cost_model(const ClusterConfig& config);

/// The KV tokens one decode instance of `config` holds: config.decode_kv_capacity_tokens when set, else its
/// HBM less the weights and the reserved share (perf::CostModel::decode_kv_capacity_tokens). Every simulated
/// or live component asks here.
int64_t decode_kv_capacity_tokens(const ClusterConfig& config);

/// The JSON names of a config's top-level fields ("slo" holds "ttft_s" and "tbt_s"; "model" and "hardware"
/// the fields of perf::model_spec_fields() and perf::hardware_spec_fields()).
std::span<const std::string_view> cluster_config_fields();
/// The JSON names of the fields of "slo".
std::span<const std::string_view> slo_config_fields();
/// The JSON names of the fields of "serve".
std::span<const std::string_view> serve_config_fields();

/// The Conductor's options for `config` under the run's `policy`, `admission` and `block_size_tokens`: the
/// one place a config's scheduling fields (kvcache_balancing_threshold, slo, seed,
/// expected_output_prior_tokens) reach the Conductor. Every simulated or live Conductor is built from it.
conductor::ConductorOptions conductor_options(const ClusterConfig& config, conductor::PrefillPolicy policy,
                                              conductor::Admission admission, int64_t block_size_tokens);

/// The engine of a disaggregated prefill instance of `config` (paper §3.1): prompts in FIFO order, computed
/// in iterations of prefill_chunk_tokens (after each, that chunk's KV can stream to decode), and a DRAM
/// prefix cache of prefill_cache_capacity_tokens in blocks of `block_size_tokens`. The simulator's and the
/// live prefill instances are built from it.
engine::EngineOptions prefill_engine_options(const ClusterConfig& config, int64_t block_size_tokens);
/// The engine of a live disaggregated decode instance of `config` (paper §3.1 step 4): continuous batching in
/// perf::CostModel::decode_kv_capacity_tokens of HBM, every step's tokens reported, a reservation dropped
/// when its KV has not arrived serve.kv_transfer_timeout_s after its prefill started. The simulator turns the
/// last two off (it streams no tokens, and its KV always arrives).
engine::EngineOptions decode_engine_options(const ClusterConfig& config);

/// Checks that `config` can run with blocks of `block_size_tokens`: block size >= 1, at least one instance
/// per pool, a prefill cache of at least one block, a valid model and hardware, model weights that leave HBM
/// room for KV in a decode instance, finite predicted times (check_cost_model_times).
/// Errors (kInvalidArgument) say which. The simulator and every live cluster check this before they start.
Status validate(const ClusterConfig& config, int64_t block_size_tokens);

/// perf::CostModel::check_times_finite for `cost` (the config's own, or an engine's from its profile) over
/// the work a cluster of `config` is given: prompts and batches up to a decode instance's KV capacity
/// (decode_kv_capacity_tokens), prefilled in the config's chunks. The error names `context` (may be empty),
/// then the model, the hardware and where the times come from ("roofline" or the profile's source).
Status check_cost_model_times(const ClusterConfig& config, const perf::CostModel& cost,
                              std::string_view context);

/// Parses a cluster config object; `where` (usually the path) prefixes error messages. Errors name the field:
/// every missing required field at once, zero instances, negative or zero bandwidths, capacities below one
/// block of `block_size_tokens`, unknown fields, unknown presets (listing the valid names).
Result<ClusterConfig> cluster_config_from_json(const nlohmann::json& j, const std::string& where,
                                               int64_t block_size_tokens);
/// Reads and parses a config file.
Result<ClusterConfig> load_cluster_config(const std::string& path, int64_t block_size_tokens);
/// The config as JSON (presets expanded), for reports.
nlohmann::json to_json(const ClusterConfig& config);

}  // namespace crescent::cluster
