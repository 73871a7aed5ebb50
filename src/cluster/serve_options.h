// How a cluster config and the command line become the options of a live run (`crescent serve` and its
// roles): the one place the "serve" section meets its flags, and a model directory meets the config.
#pragma once

#include <cstdint>
#include <string>

#include "cluster/cluster_config.h"
#include "cluster/conductor_core.h"
#include "common/status.h"

namespace crescent::cluster {

/// A model directory's facts a cluster needs (config.json; `crescent model init` writes one).
struct ModelFacts {
  perf::ModelSpec spec;        // its shape, named after the directory: what the cost model prices
  BlockKey identity = 0;       // model::model_identity: the block keys' model seed
  int64_t context_tokens = 0;  // max_position_embeddings: prompt + output never exceed it
};
/// Reads `model_dir`'s facts. Errors: the loader's, naming the file and field.
Result<ModelFacts> read_model_facts(const std::string& model_dir);

/// Flags that override a config's "serve" section; empty (or -1) leaves the config's value.
struct ServeOverrides {
  std::string policy;      // --policy (conductor::parse_prefill_policy)
  std::string admission;   // --admission (conductor::parse_admission)
  std::string executor;    // --executor (parse_executor)
  std::string model_dir;   // --model, relative to the working directory
  std::string model_name;  // --model-name; empty: "mock", or the model directory's name
  int port = -1;           // --port; -1: serve.http_port
  int64_t block_size_tokens = 512;
};

/// A live run, resolved.
struct ServeSetup {
  ClusterOptions cluster;   // the config with its overrides applied, and the model's facts
  int port = 8000;          // the HTTP port (0: any free one)
  std::string config_path;  // absolute: children are started with it
};

/// Applies `overrides` to `config` (read from `config_path`): names parsed into enums (errors name the flag
/// and list the valid names); with the cpu executor the model directory (--model, or serve.model relative to
/// the config file) is required, its shape replaces the config's model, its identity seeds the block keys
/// and its context bounds requests. kInvalidArgument for bad flags; the model loader's errors.
Result<ServeSetup> resolve_serve_options(ClusterConfig config, const std::string& config_path,
                                         const ServeOverrides& overrides);

}  // namespace crescent::cluster
