// The real executor (issue 11): runs the iterations an engine::EngineCore plans on a LlamaForward, one
// forward pass per iteration for the prefill chunk and every decoding request together, and keeps the KV
// in a PagedKvCache. Its full prompt blocks stay under their block keys after their request left for as long
// as the engine's prefix cache (the one kv::BlockCache whose hits and KV events the Conductor sees) holds
// those keys: that cache decides what is kept and evicted (a prefix's tail before its head, never a block in
// use), so a reported hit is always bytes present. A prompt starts from the longest run of its leading
// blocks found there, or imported for it (a prefix read from the pool), so reused KV is reused for real.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/compute_thread.h"
#include "common/status.h"
#include "engine/engine_core.h"
#include "kv/block_cache.h"
#include "kv/block_key.h"
#include "model/llama_forward.h"
#include "model/logprobs.h"
#include "model/sampler.h"

namespace crescent::model {

/// A request as the executor runs it.
struct ExecutorRequest {
  std::vector<int32_t> prompt = {};  // token ids (>= 1)
  std::vector<BlockKey> block_keys =
      {};                     // one per full block of the prompt: the keys it is cached and shared under
  int64_t output_tokens = 1;  // tokens to generate, the engine's output_tokens (>= 1)
  SamplingParams sampling = {};
  /// Keep its KV blocks after the engine releases it, until drop(): a prefill instance still ships them.
  bool keep_after_release = false;
  /// kNoLogprobs (nothing computed), or 0..kMaxTopLogprobs: each sampled token's logprobs with this many
  /// most likely tokens (logprobs()).
  int32_t top_logprobs = kNoLogprobs;
};

/// A request whose prompt was prefilled elsewhere, joining a decode instance with its KV.
struct DecodingRequest {
  int64_t prompt_tokens = 0;     // >= 1
  int32_t first_token = 0;       // sampled by the prefill
  int64_t output_tokens = 2;     // in all, the first included (>= 2)
  SamplingParams sampling = {};  // the prefill's: this sampler goes on after its first draw
  /// As ExecutorRequest::top_logprobs, for the tokens sampled here (the first token's came from the prefill).
  int32_t top_logprobs = kNoLogprobs;
};

/// Where the executor keeps KV.
struct CpuExecutorOptions {
  int64_t block_size_tokens = 16;  // >= 1; the engine's and the pool's block size
  /// KV blocks (>= 1). Every running request holds ceil((prompt + output) / block) of them (its cached
  /// prefix shared); blocks cached under keys the engine's prefix cache holds take the rest. Give at least
  /// the prefix cache's capacity plus what the requests computing at once need beyond it.
  int64_t capacity_blocks = 0;
};

class CpuExecutor final : public engine::Executor {
 public:
  /// `model` must outlive the executor; it is used by one executor at a time.
  CpuExecutor(LlamaForward& model, const CpuExecutorOptions& options);

  /// Registers request `id` before it is submitted to the engine (with the same prompt length, output
  /// tokens and block keys). Errors (kInvalidArgument, nothing registered): an empty prompt, a token id
  /// outside the vocabulary, prompt + output beyond the model's context ("... tokens, the model's context is
  /// N"), block keys not one per full block, invalid sampling, top_logprobs outside kNoLogprobs..
  /// kMaxTopLogprobs, `id` already registered.
  Status add_request(engine::RequestId id, ExecutorRequest request);
  /// Registers request `id` to decode here: `kv` holds its prompt's KV, ceil(prompt / block) blocks of the
  /// layout back to back (what a prefill instance wrote), copied into this executor's blocks. Submit it to
  /// the engine with submit_decode afterwards. Errors: kInvalidArgument (`id` registered, a token or length
  /// out of range, `kv` not that many blocks, invalid sampling or top_logprobs); kOutOfRange when the blocks
  /// are not free.
  Status add_decoding(engine::RequestId id, const DecodingRequest& request, std::span<const std::byte> kv);
  /// Frees request `id` whatever the engine did (ExecutorRequest::keep_after_release). No-op when unknown.
  void drop(engine::RequestId id);
  /// Block `index` of request `id`'s block table (its prompt's KV from block 0), or an empty span when there
  /// is no such block (unknown id, prefill not started).
  std::span<const std::byte> kv_block(engine::RequestId id, int64_t index) const;
  /// The tokens generated so far for `id` (empty for an unknown id).
  std::span<const int32_t> output(engine::RequestId id) const;
  /// The logprobs of the tokens this executor sampled for `id`, in order, when it asked for them
  /// (top_logprobs); empty otherwise or for an unknown id. Each is the last output() token's once it is
  /// sampled: a request from add_request has one per output token, one from add_decoding one per output
  /// token after the first (which came with its KV).
  std::span<const TokenLogprobs> logprobs(engine::RequestId id) const;
  /// Prompt tokens of `id` whose KV was found cached when its prefill started (0 before, or unknown).
  int64_t reused_tokens(engine::RequestId id) const;
  /// Why `id` stopped early ("" while fine): no free KV block when it needed one.
  std::string error(engine::RequestId id) const;

  /// Gives registered request `id` the KV of its prompt's block `index` from elsewhere (a prefix read from
  /// the pool or sent by another instance), before its prefill starts: it starts from the leading blocks it
  /// finds here or was given, as if computed. No-op when that block is cached here already. Errors:
  /// kInvalidArgument for an unknown or started `id`, an index outside its full blocks, or `bytes` not one
  /// block of the model's layout; kOutOfRange when every block is in use.
  Status import_block(engine::RequestId id, int64_t index, std::span<const std::byte> bytes);
  /// The bytes of cached block `key` (to write to the pool), or nullopt.
  std::optional<std::span<const std::byte>> cached_block(BlockKey key) const;
  /// Blocks cached under a key (in use or not), and blocks free.
  int64_t cached_blocks() const { return static_cast<int64_t>(by_key_.size()); }
  int64_t free_blocks() const { return cache_.free_blocks(); }
  /// The block layout (what import_block takes and the pool stores).
  const KvBlockLayout& layout() const { return cache_.layout(); }

  /// From now on each forward pass runs on a compute thread of the executor's own, while
  /// `wait(done_fd, progress_fd)` runs on the thread that called run_iteration_s: it serves that thread's
  /// I/O and returns once `done_fd` is readable (common/compute_thread.h); `progress_fd` becomes readable
  /// (read it: 8 bytes) each time a pass with a prompt in it has written one more layer's KV
  /// (layers_stored()); a decode-only pass does not signal it. Meanwhile
  /// `wait` must not call into the engine or this executor except: kv_block() of requests outside the pass
  /// (whose KV does not change) and, for pass_in_flight()'s prefill request, of the bytes of its layers below
  /// layers_stored(); output(), logprobs(), reused_tokens(), pass_in_flight(), layers_stored(). The compute
  /// thread runs on as many OpenMP threads as the caller's compute_threads().
  void compute_in_background(std::function<void(int done_fd, int progress_fd)> wait);

  /// The forward pass under way (while compute_in_background's wait runs): the prefill request in it, if
  /// any, and the end of its chunk (prompt tokens whose KV exists once the pass is done).
  struct PassInFlight {
    std::optional<engine::RequestId> prefill_request;
    int64_t prefill_begin_tokens = 0, prefill_end_tokens = 0;
  };
  const PassInFlight& pass_in_flight() const { return pass_; }
  /// Layers of the pass under way whose KV is written for every token of the pass (0..layers).
  int64_t layers_stored() const { return layers_stored_.load(std::memory_order_acquire); }

  // engine::Executor
  /// Computes the plan's prefill chunk (from what is cached, at least the chunk's end) and one token for
  /// each of plan.decode_ids, in one forward pass; returns the wall time it took.
  double run_iteration_s(const engine::IterationPlan& plan) override;
  bool needs_request_ids() const override { return true; }
  void release(engine::RequestId id) override;
  void use_prefix_cache(const kv::BlockCache* cache) override { prefix_cache_ = cache; }
  /// Keyed blocks no request uses are freed; those in use lose their key and are freed with their request.
  void on_blocks_removed(std::span<const BlockKey> keys) override;

 private:
  struct Request {
    ExecutorRequest spec;
    Sampler sampler;
    std::vector<int32_t> blocks = {};  // table: cached (shared) or imported prefix blocks, then its own
    std::unordered_map<int64_t, int32_t> imported = {};  // prompt block index -> its block, before it starts
    int64_t computed_tokens = 0;                         // prompt tokens whose KV is in its blocks
    int64_t reused_tokens = 0;
    std::vector<int32_t> output = {};
    std::vector<TokenLogprobs> logprobs = {};  // with spec.top_logprobs: of the tokens sampled here
    std::vector<int32_t> tokens = {};          // prompt then output, what the forward pass reads
    std::string error = {};
    bool started = false;
    bool released = false;  // by the engine, kept for its owner (keep_after_release)
  };
  struct Slot {
    std::optional<BlockKey> key;  // cached under it (the engine's prefix cache holds the key)
    int64_t refs = 0;             // requests whose table holds it
  };

  bool start_prefill(Request& r);
  std::optional<int32_t> allocate();
  void unref(int32_t block);

  LlamaForward& model_;
  CpuExecutorOptions options_;
  PagedKvCache cache_;
  std::vector<Slot> slots_;
  std::unordered_map<BlockKey, int32_t> by_key_;  // keys the engine's prefix cache holds, with their bytes
  const kv::BlockCache* prefix_cache_ = nullptr;  // the engine's (use_prefix_cache); none: nothing is kept
  std::unordered_map<engine::RequestId, Request> requests_;
  std::unique_ptr<ComputeThread> compute_thread_;  // compute_in_background's
  std::function<void(int, int)> wait_;
  PassInFlight pass_;
  std::atomic<int64_t> layers_stored_{0};
  std::vector<ForwardSequence> batch_;  // scratch
  std::vector<Request*> batch_requests_;
};

}  // namespace crescent::model
