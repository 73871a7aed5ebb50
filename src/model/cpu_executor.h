// The real executor (issue 11): runs the iterations an engine::EngineCore plans on a LlamaForward, one
// forward pass per iteration for the prefill chunk and every decoding request together, and keeps the KV
// in a PagedKvCache whose full prompt blocks stay cached under their block keys after their request left
// (least recently used evicted first, never a block in use). A prompt starts from the longest run of its
// leading blocks found there, computed here earlier or imported (a prefix read from the pool), so reused KV
// is reused for real: same bytes, no recomputation.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/engine_core.h"
#include "kv/block_key.h"
#include "model/llama_forward.h"
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
};

/// A request whose prompt was prefilled elsewhere, joining a decode instance with its KV.
struct DecodingRequest {
  int64_t prompt_tokens = 0;     // >= 1
  int32_t first_token = 0;       // sampled by the prefill
  int64_t output_tokens = 2;     // in all, the first included (>= 2)
  SamplingParams sampling = {};  // the prefill's: this sampler goes on after its first draw
};

/// Where the executor keeps KV.
struct CpuExecutorOptions {
  int64_t block_size_tokens = 16;  // >= 1; the engine's and the pool's block size
  /// KV blocks (>= 1). Every running request holds ceil((prompt + output) / block) of them (its cached
  /// prefix shared); cached blocks of departed requests fill the rest until evicted.
  int64_t capacity_blocks = 0;
};

class CpuExecutor final : public engine::Executor {
 public:
  /// `model` must outlive the executor; it is used by one executor at a time.
  CpuExecutor(LlamaForward& model, const CpuExecutorOptions& options);

  /// Registers request `id` before it is submitted to the engine (with the same prompt length, output
  /// tokens and block keys). Errors (kInvalidArgument, nothing registered): an empty prompt, a token id
  /// outside the vocabulary, prompt + output beyond the model's context ("... tokens, the model's context is
  /// N"), block keys not one per full block, invalid sampling, `id` already registered.
  Status add_request(engine::RequestId id, ExecutorRequest request);
  /// Registers request `id` to decode here: `kv` holds its prompt's KV, ceil(prompt / block) blocks of the
  /// layout back to back (what a prefill instance wrote), copied into this executor's blocks. Submit it to
  /// the engine with submit_decode afterwards. Errors: kInvalidArgument (`id` registered, a token or length
  /// out of range, `kv` not that many blocks, invalid sampling); kOutOfRange when the blocks are not free.
  Status add_decoding(engine::RequestId id, const DecodingRequest& request, std::span<const std::byte> kv);
  /// Frees request `id` whatever the engine did (ExecutorRequest::keep_after_release). No-op when unknown.
  void drop(engine::RequestId id);
  /// Block `index` of request `id`'s block table (its prompt's KV from block 0), or an empty span when there
  /// is no such block (unknown id, prefill not started).
  std::span<const std::byte> kv_block(engine::RequestId id, int64_t index) const;
  /// The tokens generated so far for `id` (empty for an unknown id).
  std::span<const int32_t> output(engine::RequestId id) const;
  /// Prompt tokens of `id` whose KV was found cached when its prefill started (0 before, or unknown).
  int64_t reused_tokens(engine::RequestId id) const;
  /// Why `id` stopped early ("" while fine): no free KV block when it needed one.
  std::string error(engine::RequestId id) const;

  /// Caches a block's KV under `key` (a prefix read from the pool or sent by another instance): later
  /// prompts whose leading blocks have these keys start from them. No-op when `key` is cached already.
  /// Errors: kInvalidArgument when `bytes` is not one block of the model's layout; kOutOfRange when every
  /// block is in use.
  Status import_block(BlockKey key, std::span<const std::byte> bytes);
  /// The bytes of cached block `key` (to write to the pool), or nullopt.
  std::optional<std::span<const std::byte>> cached_block(BlockKey key) const;
  /// Blocks cached under a key (in use or not), and blocks free.
  int64_t cached_blocks() const { return static_cast<int64_t>(by_key_.size()); }
  int64_t free_blocks() const { return cache_.free_blocks() + static_cast<int64_t>(evictable_.size()); }
  /// The block layout (what import_block takes and the pool stores).
  const KvBlockLayout& layout() const { return cache_.layout(); }

  // engine::Executor
  /// Computes the plan's prefill chunk (from what is cached, at least the chunk's end) and one token for
  /// each of plan.decode_ids, in one forward pass; returns the wall time it took.
  double run_iteration_s(const engine::IterationPlan& plan) override;
  bool needs_request_ids() const override { return true; }
  void release(engine::RequestId id) override;

 private:
  struct Request {
    ExecutorRequest spec;
    Sampler sampler;
    std::vector<int32_t> blocks = {};  // table: shared cached prefix blocks, then its own
    int64_t shared_blocks = 0;         // leading blocks taken from the cache (referenced, not owned)
    int64_t computed_tokens = 0;       // prompt tokens whose KV is in its blocks
    int64_t reused_tokens = 0;
    std::vector<int32_t> output = {};
    std::vector<int32_t> tokens = {};  // prompt then output, what the forward pass reads
    std::string error = {};
    bool started = false;
    bool released = false;  // by the engine, kept for its owner (keep_after_release)
  };
  struct Slot {
    std::optional<BlockKey> key;       // cached under it
    int64_t refs = 0;                  // running requests whose table holds it
    std::list<int32_t>::iterator lru;  // in evictable_ when cached and refs == 0
  };

  bool start_prefill(Request& r);
  std::optional<int32_t> allocate();
  void unref(int32_t block);

  LlamaForward& model_;
  CpuExecutorOptions options_;
  PagedKvCache cache_;
  std::vector<Slot> slots_;
  std::unordered_map<BlockKey, int32_t> by_key_;
  std::list<int32_t> evictable_;  // cached, unreferenced blocks; least recently used first
  std::unordered_map<engine::RequestId, Request> requests_;
  std::vector<ForwardSequence> batch_;  // scratch
  std::vector<Request*> batch_requests_;
};

}  // namespace crescent::model
