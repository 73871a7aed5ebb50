// The control messages between the Conductor and its prefill and decode instances (the multi-process
// cluster): ZeroMQ multipart frames over DEALER (instance) ↔ ROUTER (Conductor), each one msgpack array
// holding an InstanceMessage. KV events travel separately, in vLLM's format (kv_events.h); KV bytes travel
// through the transfer engine, never here.
//
//   instance → Conductor                          Conductor → instance
//   kHello       role, index, incarnation,        kPrefill    request_id, token_ids, output_tokens,
//                kv_events endpoints, capacity                 reused/fetched_tokens, ready_in_s,
//                                                             decode_index, seed, temperature, top_p,
//                                                             output_offset, top_logprobs
//   kLoad        load (every 50 ms: heartbeat),    kKvTarget   request_id, segment, offset, length (prefill)
//                draining (SIGTERM: finishing
//                what it has, then leaving)
//   kPrefillStart request_id, hit_tokens           kExpect     request_id, input/output_tokens, block_keys,
//                                                             seed, temperature, top_p, output_offset,
//                                                             top_logprobs
//                                                             (decode: count it as incoming)
//   kFirstToken  request_id, first_token,          kKvArrived  request_id, first_token (decode: the KV
//                logprobs (the prefill ended:                  is in place)
//                sent at once)
//   kPrefillDone request_id, pool hits and bytes,  kCancel     request_id
//                tokens computed, KV bytes
//                written, error (its KV
//                reached decode, or could not)
//                                                 kKvComing   request_id, input_tokens, ready_in_s
//                                                             (decode: its prefill started: reserve room;
//                                                             the KV timeout counts from its end)
//                                                 kReset      (drop every request: the Conductor has
//                                                             failed them; sent first when it sees the
//                                                             instance come up)
//                                                 kDrainAck   (the Conductor saw the instance draining:
//                                                             no new request follows)
//                                                 kCacheReport (prefill: publish the whole cache as KV
//                                                             events again: the Conductor lost track)
//   kPoolWritten request_id, pool bytes written (after
//                kPrefillDone: decode does not wait for the pool)
//   kReserved    request_id, segment, offset, length (decode: where the prefill writes the KV)
//   kTokens      request_ids, tokens (one decode step: each gained a token), logprob_rows, logprobs
//   kKvTimeout   request_id (decode: its KV never came; the reservation is freed)
//   kKvError     request_id, error (decode: a block failed its checksum)
//   kKvWritesEnded request_id (prefill: dropped   kRoomFree   request_id (decode: the room of a request
//                an order whose KV target it                  dropped before its KV arrived may be used
//                had: it writes no more there)                again: its prefill instance writes no more)
//
// A decode instance keeps the room of a request dropped before its KV arrived out of use until kRoomFree (or
// kHeldRoomTimeoutS): its prefill instance may still be writing there (stopped, then resumed, before the
// Conductor's cancel or reset reached it), and another request's KV must not be overwritten.
//
// The logprobs fields (top_logprobs, logprob_rows, logprobs) travel only in a message that has some: an
// optional tail of the array, so a message of a request that did not ask for logprobs is the same bytes as
// without them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "conductor/cluster_view.h"
#include "model/logprobs.h"

namespace crescent::serve {

/// Seconds a decode instance keeps the room of a request dropped before its KV arrived out of use when no
/// kRoomFree comes (its prefill instance gone for good, or the Conductor that knew of it): then it is used
/// again.
inline constexpr double kHeldRoomTimeoutS = 60;

/// Which pool an instance serves.
enum class InstanceRole : uint8_t { kPrefill, kDecode };
/// "prefill", "decode".
std::string_view to_string(InstanceRole role);

/// One control message; each kind uses the fields listed above, the others stay empty.
struct InstanceMessage {
  enum class Kind : uint8_t {
    kHello,
    kLoad,
    kPrefillStart,
    kPrefillDone,
    kReserved,
    kTokens,
    kKvTimeout,
    kKvError,
    kPrefill,
    kKvTarget,
    kExpect,
    kKvArrived,
    kCancel,
    kKvComing,
    kReset,
    kFirstToken,
    kPoolWritten,
    kDrainAck,
    kCacheReport,
    kKvWritesEnded,
    kRoomFree,
  };
  Kind kind = Kind::kLoad;
  uint64_t request_id = 0;
  // kHello
  InstanceRole role = InstanceRole::kPrefill;
  uint32_t index = 0;
  uint64_t incarnation = 0;  // differs each time an instance starts: a restart is seen even without a gap
  std::string kv_events_endpoint, kv_replay_endpoint;
  int64_t kv_capacity_tokens = 0;
  // kLoad: a decode instance's kv::DecodeLoad, and requests not finished (queued, prefilling, ...)
  kv::DecodeLoad load;
  int64_t outstanding = 0;
  // kHello, kLoad: the instance is draining (it takes no new request and leaves once its own are done)
  bool draining = false;
  // kPrefill, kExpect
  std::vector<int64_t> token_ids;
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t reused_tokens = 0, fetched_tokens = 0;
  double ready_in_s = 0;  // the fetched prefix exists at its source from this many seconds after sending
  uint32_t decode_index = 0;
  // kPrefill, kExpect: how the request samples (cluster::ClusterRequest)
  uint64_t seed = 0;
  double temperature = 1, top_p = 1;
  int64_t output_offset = 0;  // tokens generated before this placement (cluster::ClusterRequest)
  // kFirstToken, kKvArrived: the first output token (sampled by the prefill instance)
  int64_t first_token = 0;
  // kPrefillStart, kPrefillDone
  int64_t hit_tokens = 0;               // prompt tokens reused (prefill start)
  int64_t pool_hit_tokens = 0;          // of them, read from the pool (prefill done)
  int64_t fetched_tokens_expected = 0;  // of them, the arranged prefix to read from the pool (prefill done)
  int64_t computed_tokens = 0;          // prompt tokens its executor computed, not reused (prefill done)
  uint64_t kv_bytes = 0;                // KV bytes written to the decode instance (prefill done)
  std::string kv_transport;             // the transport that carried them ("tcp", "shm", "ucx"; prefill done)
  uint64_t kv_chunks = 0;        // in this many writes: chunks streamed while the prefill ran, then the rest
  uint64_t pool_read_bytes = 0;  // KV bytes read from and written to the pool (prefill done)
  uint64_t pool_write_bytes = 0;
  // kLoad of a decode instance: KV blocks checked on arrival since it started, and those that failed
  uint64_t blocks_verified = 0, checksum_failures = 0;
  // kReserved, kKvTarget
  std::string segment;
  uint64_t offset_bytes = 0, length_bytes = 0;
  // kTokens: each request's new token
  std::vector<uint64_t> request_ids;
  std::vector<int64_t> tokens;
  // kPrefill, kExpect: model::kNoLogprobs, or how many alternatives each token's logprobs carry
  // (cluster::ClusterRequest::top_logprobs)
  int32_t top_logprobs = model::kNoLogprobs;
  // kFirstToken: the first token's logprobs (one, when its request asked). kTokens: logprobs[j] goes with
  // the token of request_ids[logprob_rows[j]], for the requests that asked only (rows increasing).
  std::vector<uint32_t> logprob_rows;
  std::vector<model::TokenLogprobs> logprobs;
  // kExpect: the keys of the prompt's KV blocks, in order (kv::shipped_block_keys)
  std::vector<uint64_t> block_keys;
  // kPrefillDone, kKvError: empty = fine
  std::string error;
};

/// The msgpack encoding of `message`.
std::string encode(const InstanceMessage& message);
/// Parses encode's output; kInvalidArgument naming what is wrong (not msgpack, wrong shape, unknown kind,
/// logprobs whose parts disagree in length, more than model::kMaxTopLogprobs alternatives, rows not
/// increasing or beyond request_ids).
Result<InstanceMessage> decode_instance_message(std::string_view bytes);

}  // namespace crescent::serve
