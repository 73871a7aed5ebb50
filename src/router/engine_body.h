// The body router mode sends an engine for a request (router.h): the client's, with the prompt as the token
// ids the router placed it by, and vLLM's kv_transfer_params for a disaggregated request's two steps.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "serve/relay.h"

namespace crescent::router {

/// The body `request`'s engine gets, as JSON text: the client's body with
/// - its prompt replaced by request.prompt_token_ids for /v1/completions when `token_ids` (the engine takes
///   them);
/// - in the prefill step of a disaggregated request (`prefill_step`), vLLM's remote-decode parameters as its
///   own disaggregated proxy sends them (kv_transfer_params {do_remote_decode: true, ...}), stream false,
///   max_tokens (and max_completion_tokens, when given) 1, and no stream_options, min_tokens or
///   min_completion_tokens;
/// - in the decode step, `kv_transfer_params` (the prefill answer's) when not null.
/// The text is what dumping that edited body with nlohmann (sorted keys, no spaces, invalid UTF-8 replaced)
/// gives, written without copying the body or building the token ids as JSON values: a 32 KiB prompt's
/// 8,000 ids are most of the work.
std::string engine_body(const serve::RelayedRequest& request, bool token_ids, bool prefill_step,
                        const nlohmann::json* kv_transfer_params);

}  // namespace crescent::router
