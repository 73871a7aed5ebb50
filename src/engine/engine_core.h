// One instance's engine (paper §2.1, §3.1), written once for the simulator and the live instances: a FIFO
// queue of prompts prefilled whole or in chunks (with an optional prefix cache, in HBM for a colocated node
// or in DRAM for a disaggregated prefill instance), and a continuous decode batch whose KV reservations are
// bounded by HBM. Time is injected: the core plans an iteration, an Executor runs it (the MockExecutor only
// says how long it would take), and the core is told when it ended. The simulator's prefill and decode
// instances and its colocated nodes run it on a virtual clock, live instances on a steady one, both through
// advance_until / next_event_s.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/step_log.h"
#include "kv/block_cache.h"
#include "kv/block_key.h"
#include "kv/block_map.h"
#include "kv/decode_load.h"
#include "perf/cost_model.h"

namespace crescent::engine {

/// A request's id within one engine (the simulator uses trace indexes, live instances their request ids).
using RequestId = uint64_t;

/// What one iteration computes: one token for each running request, and/or a piece of one prompt.
struct IterationPlan {
  int64_t decode_requests = 0;               // running requests gaining a token (0: no decode this iteration)
  int64_t decode_context_tokens = 0;         // KV tokens they attend to
  std::optional<RequestId> prefill_request;  // whose prompt is being prefilled, if any
  int64_t prefill_tokens = 0;                // prompt tokens computed this iteration
  int64_t prefill_prefix_tokens = 0;         // tokens before them whose KV is already in HBM
  /// Before computing, bring a reused prefix into HBM (paper §3.1 step 1; the prompt's first iteration on an
  /// engine whose prefix lives in DRAM): `load_tokens` from DRAM, of which `fetch_tokens` first come over the
  /// network from another instance or the pool.
  int64_t load_tokens = 0;
  int64_t fetch_tokens = 0;
  /// The running requests gaining a token, oldest first (only for an executor that needs_request_ids()).
  std::span<const RequestId> decode_ids;
  bool empty() const { return decode_requests == 0 && prefill_tokens == 0; }
};

/// Runs iterations. The mock says how long an iteration would take from the cost model; a real executor
/// (model::CpuExecutor) computes the transformer and returns the time it took.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Runs `plan` (not empty); returns its duration in seconds.
  virtual double run_iteration_s(const IterationPlan& plan) = 0;
  /// Whether plans must name the decoding requests (IterationPlan::decode_ids: O(batch) per step, which a
  /// real executor computes anyway and the mock does not need).
  virtual bool needs_request_ids() const { return false; }
  /// Request `id` left the engine (finished, cancelled, or dropped when its KV never came), after the
  /// listener heard of it: the executor may free what it holds for it.
  virtual void release(RequestId id) { (void)id; }
  /// The engine's prefix cache (EngineOptions::prefix_cache), from its constructor: an executor that keeps
  /// KV bytes indexes them by it, so the blocks the engine reports as hits (and publishes in KV events) are
  /// the blocks whose bytes it has: a block's bytes are kept under its key while this cache holds the key
  /// (or a request still uses them). `cache` outlives the engine. REQUIRES: one engine per such executor.
  virtual void use_prefix_cache(const kv::BlockCache* cache) { (void)cache; }
  /// The engine's prefix cache no longer holds `keys` (evicted, not stored for lack of room, or stored for a
  /// prompt cancelled before computing them): their bytes may go once no request uses them.
  virtual void on_blocks_removed(std::span<const BlockKey> keys) { (void)keys; }
};

/// The mock model's output: a deterministic token (a byte: 'a'..'z' or ' ') for output position `index` of a
/// request whose sampler seed is `seed`. What an instance running the MockExecutor answers.
int64_t mock_token(uint64_t seed, int64_t index);

/// Executor whose iterations take perf::CostModel::iteration_time_s and compute nothing.
class MockExecutor final : public Executor {
 public:
  /// `cost` must outlive the executor.
  explicit MockExecutor(const perf::CostModel& cost) : cost_(cost) {}
  double run_iteration_s(const IterationPlan& plan) override {
    const double compute_s = cost_.iteration_time_s(plan.decode_requests, plan.decode_context_tokens,
                                                    plan.prefill_tokens, plan.prefill_prefix_tokens);
    if (plan.load_tokens == 0) return compute_s;
    // As the Conductor predicts a prefix's transfer (Decision::transfer_s), before the compute.
    return cost_.kv_transfer_time_s(plan.fetch_tokens) + cost_.kv_load_time_s(plan.load_tokens) + compute_s;
  }

 private:
  const perf::CostModel& cost_;
};

/// How an engine prefills and how much KV it holds.
struct EngineOptions {
  int64_t kv_capacity_tokens = 0;  // HBM for KV (perf::CostModel::decode_kv_capacity_tokens); >= 1
  /// Chunked prefill (vLLM's max_num_batched_tokens): each iteration decodes every running request (one
  /// token of budget each) and spends what is left of this budget on one prompt. 0: whole prompts, and an
  /// iteration that prefills does not decode (the batch stalls: paper §5.2.2).
  int64_t chunk_tokens = 0;
  bool prefix_cache = false;        // automatic prefix caching, blocks of block_size_tokens
  int64_t block_size_tokens = 512;  // >= 1
  /// The prefix cache is in DRAM (a disaggregated prefill instance's): it holds kv_capacity_tokens, no prompt
  /// reserves room in it (the prompt computes in HBM, which the Conductor's context-length check bounds), a
  /// prompt's blocks are looked up and pinned in it when the prompt is queued (not when its prefill starts),
  /// and a reused prefix is loaded into HBM before its prompt is computed (IterationPlan::load_tokens).
  /// Otherwise the cache is in HBM and shares kv_capacity_tokens with the reservations.
  bool prefix_in_dram = false;
  bool report_tokens = false;  // call EngineListener::on_tokens after every decode step
  /// Disaggregated decode: an expected request whose KV has not arrived this many seconds after expect() is
  /// dropped and its reservation freed (a dead prefill must not leak decode memory). 0: never.
  double kv_transfer_timeout_s = 0;
};

/// What admission decided for a prompt when its prefill starts.
struct PrefillStart {
  int64_t hit_tokens = 0;        // prompt tokens reused: the prefix cache's, or the arranged prefix if longer
  int64_t local_hit_tokens = 0;  // of them, found in this engine's own prefix cache (in DRAM: when queued)
  int64_t prefill_tokens = 0;    // tokens to compute (>= 1: the last is always recomputed for its logits)
  int64_t reused_tokens = 0;     // input - prefill_tokens: KV reused, not computed
};

/// Told what happens to requests, in time order. Called from inside the engine's calls; must not call back
/// into the engine.
class EngineListener {
 public:
  virtual ~EngineListener() = default;
  /// `id`'s HBM is reserved and its prefill starts at `now_s`.
  virtual void on_prefill_start(RequestId id, double now_s, const PrefillStart& start) = 0;
  /// A chunk of `id`'s prompt other than the last was computed by `now_s`: the KV of its first
  /// `computed_tokens` (reused prefix included) exists (chunked prefill only).
  virtual void on_prefill_chunk(RequestId id, int64_t computed_tokens, double now_s) {
    (void)id;
    (void)computed_tokens;
    (void)now_s;
  }
  /// `id`'s prefill ended at `now_s` with its first token.
  virtual void on_first_token(RequestId id, double now_s) = 0;
  /// `id` produced its last token at `now_s` and left; `gaps` are its token gaps when it decoded (none for a
  /// one-token output).
  virtual void on_finished(RequestId id, double now_s, const std::optional<StepLog::Gaps>& gaps) = 0;
  /// A decode step ended at `now_s`, giving each of `ids` one token (only with EngineOptions::report_tokens:
  /// it costs O(batch) per step, which a live instance streaming tokens pays and the simulator does not).
  virtual void on_tokens(std::span<const RequestId> ids, double now_s) {
    (void)ids;
    (void)now_s;
  }
  /// Expected request `id` was dropped at `now_s`: its KV did not arrive within kv_transfer_timeout_s.
  virtual void on_kv_timeout(RequestId id, double now_s) {
    (void)id;
    (void)now_s;
  }
  /// The prefix cache stored blocks and removed others at `now_s` (a KV event: ClusterState::on_kv_event).
  /// `removed`: evicted, or a prompt's blocks it had no room to keep.
  virtual void on_kv_event(std::span<const BlockKey> stored, std::span<const BlockKey> removed,
                           double now_s) {
    (void)stored;
    (void)removed;
    (void)now_s;
  }
};

/// The engine of one instance. Nothing per iteration is proportional to the batch: the running batch is a
/// few totals, a min-heap says who leaves after which decode step, and a StepLog gives a leaving request's
/// TBT. No request is ever preempted: admission reserves KV for prompt + whole output. Not thread-safe.
class EngineCore {
 public:
  /// `executor` and `listener` must outlive the engine.
  EngineCore(const EngineOptions& options, Executor& executor, EngineListener& listener);

  /// Queues a prompt (FIFO) to be prefilled here, then decoded for `output_tokens` - 1 steps (the first token
  /// comes from the prefill). `block_keys` (one per block of the prompt) are kept for the prefix cache. An
  /// idle engine starts an iteration at `now_s`. REQUIRES: advanced to now_s; input_tokens >= 1;
  /// output_tokens >= 1; input + output <= kv_capacity_tokens (unless the cache is in DRAM: prefix_in_dram);
  /// `id` not in the engine.
  void submit_prompt(RequestId id, int64_t input_tokens, int64_t output_tokens,
                     std::span<const BlockKey> block_keys, double now_s);
  /// What the Conductor arranged for a prompt's prefix (Decision): its first `reused_tokens` are reused
  /// rather than computed (at least what the engine's own cache holds), `fetched_tokens` of them brought from
  /// another instance or the pool once they exist there (`ready_s`: the FIFO head waits for it). The
  /// engine's cache then holds as much of the prompt as it has room for, as after a fetch.
  struct ArrangedPrefix {
    int64_t reused_tokens = 0;
    int64_t fetched_tokens = 0;
    double ready_s = 0;  // the fetched part exists (its source computed it) from then: the prompt waits
  };
  /// `keyed_blocks`: the caller knows no later prompt names the blocks from this index on (and none of them
  /// occurs twice in this one), so the prefix cache may keep those it does not hold already unkeyed
  /// (kv::BlockCache::touch): they take room and are
  /// evicted as keyed blocks would be, but cost no map entry, and no KV event names them (nor
  /// Executor::on_blocks_removed: the executor must keep no bytes by key). The simulator knows it from its
  /// trace; a live instance keys every block (the default).
  void submit_prompt(RequestId id, int64_t input_tokens, int64_t output_tokens,
                     std::span<const BlockKey> block_keys, double now_s, ArrangedPrefix prefix,
                     size_t keyed_blocks = std::numeric_limits<size_t>::max());

  /// Disaggregated decode: `id` was placed here; its KV is on its way (counted as incoming in decode_load()).
  /// `now_s` starts its kv_transfer_timeout_s. REQUIRES: output_tokens >= 2 (a one-token request never
  /// reaches decode); `id` not in the engine.
  void expect(RequestId id, int64_t input_tokens, int64_t output_tokens, double now_s = 0);
  /// Moves expected request `id`'s KV deadline to `deadline_s` (infinity: none), e.g. to hold a reservation
  /// while its prompt waits in a prefill queue and count the timeout once its prefill has started. False
  /// (nothing changed) when `id` is not expected here.
  bool set_kv_deadline(RequestId id, double deadline_s);
  /// The KV of expected request `id` arrived at `now_s` (its first token came at `first_token_s`); it joins
  /// the batch at the next step boundary (now, if idle) once HBM has room. False (nothing changed) when
  /// `id` is not expected here: cancelled, or dropped by the KV transfer timeout. REQUIRES: advanced to
  /// now_s.
  bool submit_decode(RequestId id, double first_token_s, double now_s);

  /// Virtual clock: runs (with the executor) every iteration that ends at or before `t_s`.
  void advance_until(double t_s);
  /// When the iteration under way ends, or the next KV transfer deadline passes (infinity when neither): a
  /// steady-clock driver sleeps until then, a virtual one jumps there.
  double next_event_s() const;

  /// Drops request `id` wherever it is (queued, prefilling, waiting, decoding, incoming) and frees its HBM
  /// reservation; the listener hears nothing more of it. A decoding request stops at once: the iteration
  /// under way still counts it, the next does not. No-op for an unknown or finished id.
  void cancel(RequestId id);
  /// Drops every request, as cancel() does for each (a reset: whoever placed them has forgotten them).
  void cancel_all();

  /// Requests here and not finished: queued, prefilling, waiting for HBM or decoding (not incoming).
  int64_t outstanding() const { return outstanding_; }
  /// Every block key the prefix cache holds (none without EngineOptions::prefix_cache), unkeyed blocks aside.
  std::vector<BlockKey> prefix_cache_keys() const {
    return cache_ ? cache_->keys() : std::vector<BlockKey>{};
  }
  bool prefix_cache_contains(BlockKey key) const { return cache_ && cache_->contains(key); }
  /// Puts blocks computed before this engine existed in its prefix cache, unpinned: `keys`, most recent
  /// first, as a restarted prefill instance adopts them from its cache file (kv/persistent_block_file.h).
  /// Keys beyond the cache's room are skipped. The listener hears of them (a KV event: stored, and removed
  /// for those skipped or evicted). Returns the blocks the cache then holds of `keys`. REQUIRES: nothing
  /// queued or running (a restart: the engine is new).
  int64_t adopt_prefix(std::span<const BlockKey> keys);
  /// Whether an iteration is under way or requests are waiting or on their way.
  bool busy() const { return busy_ || !waiting_decode_.empty() || incoming_.requests > 0; }
  /// The decode pool's view of this engine (ClusterState's "decode report").
  kv::DecodeLoad decode_load() const {
    return {running_, waiting_decode_load_, incoming_, options_.kv_capacity_tokens};
  }
  /// Starts loading what the engine's next decode step reads, so that a caller about to advance many engines
  /// (the simulator's decode instances) overlaps their cache misses. Changes nothing. Two parts: the
  /// engine's own fields, then where its step log appends, which is found by reading those fields: a caller
  /// issues the first for every engine before the second for any, so no read waits on a line just asked for.
  [[gnu::always_inline]] void prefetch_step() const {
    const auto* first = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(this) & ~uintptr_t{63});
    const auto* end = reinterpret_cast<const char*>(&kv_deadlines_ + 1);
    for (const char* line = first; line < end; line += 64) __builtin_prefetch(line);
  }
  /// The second part: starts loading where the step log's next append writes.
  [[gnu::always_inline]] void prefetch_step_log() const { log_.prefetch_next(); }
  /// Iterations run, and those that decoded (continuous-batching steps), since construction.
  int64_t iterations() const { return iterations_; }
  int64_t decode_steps() const { return decode_steps_; }
  /// Of the decode steps, those advance_until ran on its fast path (a steady batch: docs/benchmarks.md,
  /// "Unkeyed blocks and cheaper decode steps").
  int64_t fast_decode_steps() const { return fast_decode_steps_; }

 private:
  struct Record {
    int64_t input_tokens = 0;
    int64_t output_tokens = 0;
    int64_t decode_steps = 0;  // output tokens after the first
    int64_t prefill_tokens = 0;
    int64_t reused_tokens = 0;
    int64_t prefill_done_tokens = 0;
    ArrangedPrefix arranged;
    int64_t load_tokens = 0;           // prefix to load before the first iteration (prefix_in_dram)
    int64_t cached_prefix_tokens = 0;  // its prompt's leading blocks found in the prefix cache
    std::vector<BlockKey> owned;       // DRAM cache: blocks it stored and will compute (pending_)
    int64_t join_step = 0;             // its first decode step
    double first_token_s = 0;
    double kv_deadline_s = 0;  // expected: drop it if its KV has not arrived by then
    bool finished = false;
    enum class Where { kIncoming, kQueued, kPrefilling, kWaitingDecode, kDecoding } where = Where::kIncoming;
    std::vector<BlockKey> block_keys;  // with the prefix cache (a DRAM cache: the keyed ones once taken)
    size_t keyed_blocks = std::numeric_limits<size_t>::max();  // submit_prompt's
    std::vector<BlockKey> pinned;      // blocks pinned in the prefix cache while it runs
    kv::UnkeyedRun unkeyed;            // and its unkeyed blocks, pinned
  };

  void start_iteration(double start_s);
  void finish_iteration(double end_s);
  bool decode_only_step() const;
  void leaving_changed() { next_leave_step_ = leaving_.empty() ? kNoStep : leaving_.top().first; }
  static constexpr int64_t kNoStep = std::numeric_limits<int64_t>::max();
  int64_t take_cached_prefix(RequestId id, Record& r, double now_s);
  int64_t computed_prefix_tokens(RequestId id, Record& r);
  void drop_uncomputed(RequestId id, Record& r);
  void mark_computed(RequestId id, Record& r);
  bool admit_prompt(RequestId id, Record& r, double now_s);
  void admit_decodes();
  void join_batch(RequestId id, Record& r);
  void leave_batch(RequestId id, int64_t step, double now_s);
  void finish(RequestId id, Record& r, double now_s, const std::optional<StepLog::Gaps>& gaps);
  static void add(kv::DecodeGroup& group, const Record& r, int sign);

  // First, together: what a decode step reads and writes (the simulator's decode instances run ~100 steps
  // a request, each on an engine whose lines other work has evicted since its last step: every line it
  // touches is a miss). advance_until's fast path reads only these.
  bool busy_ = false;
  // The iteration under way only decodes, and until a request is due to leave each next one is the same
  // batch with one more token each (decode_only_step()): set when an iteration starts, cleared by what could
  // change the next plan (a prompt or a decode arriving, a cancel).
  bool steady_decode_ = false;
  bool decoding_finished_ = false;     // a request in decoding_ finished since finish_iteration last looked
  double end_s_ = 0;                   // of the iteration under way
  double now_s_ = 0;                   // the latest time the engine was told (for events of cancel())
  int64_t next_leave_step_ = kNoStep;  // leaving_'s first (kNoStep when empty)
  kv::DecodeGroup running_;
  int64_t iterations_ = 0;
  int64_t decode_steps_ = 0;
  int64_t fast_decode_steps_ = 0;
  Executor& executor_;
  IterationPlan plan_;
  StepLog log_;
  // (KV deadline, id), earliest first; an entry whose deadline no longer matches its record's is stale.
  std::priority_queue<std::pair<double, RequestId>, std::vector<std::pair<double, RequestId>>, std::greater<>>
      kv_deadlines_;

  EngineOptions options_;
  EngineListener& listener_;
  std::unordered_map<RequestId, Record> records_;
  int64_t outstanding_ = 0;
  int64_t reserved_kv_tokens_ = 0;  // prompt + max output of every admitted, unfinished request
  kv::DecodeGroup waiting_decode_load_, incoming_;
  std::deque<RequestId> waiting_prompts_;  // FIFO, not yet admitted
  std::optional<RequestId> prefilling_;    // admitted, prompt not done
  std::deque<RequestId> waiting_decode_;   // KV arrived, waiting for HBM room
  // In join order, to find the oldest request still decoding, with its record: a record stays in records_
  // (whose nodes do not move) until it leaves the front here, so the pointer saves a lookup when a request
  // finished (decoding_finished_) or a plan names the batch's requests.
  struct Decoding {
    RequestId id;
    Record* record;
    int64_t join_step;  // record->join_step, here so that each step need not read the record
  };
  std::deque<Decoding> decoding_;
  // (last decode step, request): who leaves after which step.
  std::priority_queue<std::pair<int64_t, RequestId>, std::vector<std::pair<int64_t, RequestId>>,
                      std::greater<>>
      leaving_;
  kv::TouchEvents touch_events_;       // scratch
  std::vector<RequestId> token_ids_;   // scratch for on_tokens
  std::vector<RequestId> decode_ids_;  // IterationPlan::decode_ids
  // Last: the two block maps are ~10 KiB each.
  std::optional<kv::BlockCache> cache_;  // with EngineOptions::prefix_cache
  // DRAM cache: blocks stored for a queued or prefilling prompt and not computed yet, with that prompt.
  kv::BlockMap<RequestId> pending_;
};

}  // namespace crescent::engine
