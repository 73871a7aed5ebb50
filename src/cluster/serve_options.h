// How a cluster config and the command line become the options of a live run (`crescent serve` and its
// roles): the one place the "serve" section meets its flags, and a model directory meets the config.
#pragma once

#include <cstdint>
#include <string>

#include "cluster/cluster_config.h"
#include "cluster/conductor_core.h"
#include "common/status.h"

namespace crescent::cluster {

/// Blocks a decode instance keeps beyond its KV capacity, in its executor and in its receive buffer each: a
/// block of rounding per request for up to this many requests (prompt + output rarely end on a block).
inline constexpr int64_t kDecodeRoundingBlocks = 512;

/// A model directory's facts a cluster needs (config.json; `crescent model init` writes one).
struct ModelFacts {
  perf::ModelSpec spec;        // its shape, named after the directory: what the cost model prices
  BlockKey identity = 0;       // model::model_identity: the block keys' model seed
  int64_t context_tokens = 0;  // max_position_embeddings: prompt + output never exceed it
  int64_t weight_bytes = 0;    // what an instance holds of it (fp32: the forward pass widens bf16)
};
/// Reads `model_dir`'s facts. Errors: the loader's, naming the file and field.
Result<ModelFacts> read_model_facts(const std::string& model_dir);

/// Flags that override a config's "serve" section; empty (or -1, 0) leaves the config's value.
struct ServeOverrides {
  std::string policy = {};      // --policy (conductor::parse_prefill_policy)
  std::string admission = {};   // --admission (conductor::parse_admission)
  std::string executor = {};    // --executor (parse_executor)
  std::string model_dir = {};   // --model, relative to the working directory
  std::string model_name = {};  // --model-name; empty: "mock", or the model directory's name
  int port = -1;                // --port; -1: serve.http_port
  int64_t block_size_tokens = 512;
  int64_t kv_cache_bytes = 0;  // --kv-cache-bytes; 0: serve.kv_cache_bytes
  /// Whether every instance of the config runs on this machine (the supervisor's children share its memory)
  /// or one (a role alone), for a KV cache budget taken from the machine.
  bool all_instances_on_this_machine = false;
};

/// A live run, resolved.
struct ServeSetup {
  ClusterOptions cluster;   // the config with its overrides applied, and the model's facts
  int port = 8000;          // the HTTP port (0: any free one)
  std::string config_path;  // absolute: children are started with it
  /// With the cpu executor: how much KV an instance holds and where the budget came from, for the start
  /// line ("KV cache 1.20 GiB per instance (...): decode 40960 tokens, prefill cache 75776 tokens").
  std::string kv_cache_note;
};

/// Applies `overrides` to `config` (read from `config_path`): names parsed into enums (errors name the flag
/// and list the valid names); with the cpu executor the model directory (--model, or serve.model relative to
/// the config file) is required, its shape replaces the config's model, its identity seeds the block keys
/// and its context bounds requests, and the KV cache budget (docs/config.md, serve.kv_cache_bytes) bounds
/// the capacities: a decode instance's batch holds half of it (decode_kv_capacity_tokens), a prefill
/// instance's prefix cache what is left after two prompts (prefill_cache_capacity_tokens); the resolved
/// budget is written back to serve.kv_cache_bytes. kInvalidArgument for bad flags or a budget that cannot
/// hold one request of the model's context (naming the numbers); the model loader's errors.
Result<ServeSetup> resolve_serve_options(ClusterConfig config, const std::string& config_path,
                                         const ServeOverrides& overrides);

}  // namespace crescent::cluster
