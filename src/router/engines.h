// Router mode (docs/router.md): the inference engines crescent routes to but does not own (vLLM- or
// SGLang-style OpenAI-compatible servers), as the operator names them in an engines file or in etcd.
//   {"engines": [{"name": "gpu-0", "url": "http://10.0.0.5:8000", "role": "both", "model": "llama3-8b",
//                 "block_size": 16, "kv_events": "tcp://10.0.0.5:5557", "kv_replay": "tcp://10.0.0.5:5558"}]}
// Optional per entry: "profile" (a `crescent profile --url` file: the engine's cost model),
// "cache_blocks" (its prefix cache size, for tracking it without KV events; default: what its /metrics
// says), "kv_capacity_tokens" (its KV cache in tokens; default: its /metrics), "token_ids" (false: it takes
// completions prompts as text only; default true), "api_key_file" (a file holding the engine's API key),
// "kv_pool" (the name of a KV pool the engine's connector shares with the other engines, as vLLM with
// LMCache's connector does: a prefix one engine computed, another loads from it).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::router {

/// What an engine does: prefill only (its KV goes to a decode engine through vLLM's kv_transfer_params
/// handshake), decode only, or both (a colocated instance).
enum class EngineRole { kPrefill, kDecode, kBoth };
/// "prefill", "decode", "both".
std::string_view to_string(EngineRole role);

/// One engine as the operator names it.
struct EngineEntry {
  std::string name;  // unique among the engines; what logs and metrics call it
  std::string url;   // its OpenAI-compatible HTTP server, "http://host:port"
  EngineRole role = EngineRole::kBoth;
  std::string model;  // the model it serves (its /v1/models must list it)
  int64_t block_size_tokens = 0;  // its KV cache's block size (vLLM's --block-size); every engine's must agree
  std::string kv_events;  // its KV-event PUB endpoint ("tcp://host:port"); empty: it publishes none
  std::string kv_replay;  // its replay ROUTER endpoint; empty: gaps cannot be replayed
  std::string profile_path;  // a `crescent profile --url` file; empty: the router's default cost model
  int64_t cache_blocks = 0;        // prefix cache size in blocks; 0: from its /metrics (vllm:cache_config_info)
  int64_t kv_capacity_tokens = 0;  // KV cache size in tokens; 0: from its /metrics
  bool token_ids = true;           // its /v1/completions takes prompts as token ids
  std::string api_key_file;        // empty: the engine asks for no key
  std::string kv_pool;             // the KV pool its connector shares with other engines; empty: none
};

/// Reads one entry (a JSON object); `where` names it in errors ("engines.json: engines[2]"). Errors
/// (kInvalidArgument) name `where`, the entry's name when it has one, and the field: missing or of the wrong
/// type, an unknown field (a typo would otherwise be ignored), a url that is not http://host:port, a role
/// other than prefill|decode|both, a block_size < 1, an endpoint that is not tcp://host:port or whose host
/// is not the url's (events must come from the engine itself), kv_replay without kv_events.
Result<EngineEntry> engine_from_json(const nlohmann::json& j, const std::string& where);
/// The entry as engine_from_json reads it (fields at their defaults left out).
nlohmann::json to_json(const EngineEntry& entry);

/// Reads every entry of an engines file (`{"engines": [...]}`, or the array alone) and checks them together:
/// names unique, one block size, one model and one kv_pool (or none) for all, and the roles making a cluster
/// (every engine `both`, or at least one prefill and one decode engine and no `both`). Errors name the file
/// and entry.
Result<std::vector<EngineEntry>> load_engines_file(const std::string& path);
/// The checks load_engines_file makes across entries, for entries from anywhere (`where` names their source).
Status check_engines(const std::vector<EngineEntry>& engines, const std::string& where);

/// Host and port of an http:// URL or a tcp:// endpoint ("http://h:p", "tcp://h:p"); kInvalidArgument naming
/// `what` when it is not one.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
Result<HostPort> parse_host_port(std::string_view url, std::string_view scheme, std::string_view what);

}  // namespace crescent::router
