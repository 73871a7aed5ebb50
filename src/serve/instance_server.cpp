#include "serve/instance_server.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/cluster_config.h"
#include "cluster/serve_options.h"
#include "common/clock.h"
#include "common/socket_io.h"
#include "engine/engine_core.h"
#include "kv/persistent_block_file.h"
#include "model/cpu_executor.h"
#include "model/cpu_limits.h"
#include "serve/etcd_registry.h"
#include "serve/kv_blocks.h"
#include "serve/kv_events.h"
#include "serve/members_only.h"
#include "store/client.h"
#include "store/segment_allocator.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace crescent::serve {
namespace {

constexpr double kLoadPeriodS = 0.05;  // load report / heartbeat
// Draining: how long to wait for the Conductor's acknowledgement (it may be gone), and for the last
// messages to leave when the instance closes.
constexpr double kDrainAckWaitS = 5;
constexpr int kDrainLingerMs = 1000;
constexpr auto kTransferTimeout = std::chrono::seconds(5);

uint64_t make_incarnation() {
  return (static_cast<uint64_t>(::getpid()) << 32) ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

class InstanceServer::Impl final : public engine::EngineListener {
 public:
  /// `model`: the cpu executor's (nullptr: the mock's). A prefill instance has a `store` client (the pool)
  /// and uses its transfer engine; a decode instance has a transfer engine of its own (`engine`).
  Impl(const InstanceOptions& options, std::unique_ptr<store::Client> store,
       std::unique_ptr<transfer::TransferEngine> engine, std::unique_ptr<model::LlamaForward> model)
      : options_(options),
        config_(options.cluster.config),
        block_tokens_(options.cluster.block_size_tokens),
        cost_(cluster::cost_model(config_)),
        mock_executor_(cost_),
        model_(std::move(model)),
        store_(std::move(store)),
        own_transfer_(std::move(engine)),
        transfer_(store_ ? store_->engine() : *own_transfer_),
        block_bytes_(
            model_ ? static_cast<uint64_t>(model_->kv_layout(block_tokens_).block_bytes())
                   : kv_block_bytes(block_tokens_, scaled_kv_bytes_per_token(cost_.kv_bytes_per_token(),
                                                                             config_.serve.kv_bytes_scale))),
        layers_(model_ ? model_->config().num_hidden_layers : 1),
        max_prompt_blocks_((cluster::max_context_tokens(options.cluster) + block_tokens_ - 1) /
                           block_tokens_),
        incarnation_(make_incarnation()),
        identity_(fmt::format("{}-{}", to_string(options.role), options.index)),
        control_(context_, zmq::socket_type::dealer) {
    const engine::EngineOptions engine_options = prefill()
                                                     ? cluster::prefill_engine_options(config_, block_tokens_)
                                                     : cluster::decode_engine_options(config_);
    engine::Executor* executor = &mock_executor_;
    if (model_) {
      // The engine's KV in blocks: a prefill instance's DRAM prefix cache and the prompt it computes; a
      // decode instance's HBM, with a block of rounding per request (cluster::kDecodeRoundingBlocks).
      const int64_t capacity_blocks =
          (engine_options.kv_capacity_tokens + block_tokens_ - 1) / block_tokens_ +
          (prefill() ? max_prompt_blocks_ + 1 : cluster::kDecodeRoundingBlocks);
      cpu_executor_ = std::make_unique<model::CpuExecutor>(
          *model_,
          model::CpuExecutorOptions{.block_size_tokens = block_tokens_, .capacity_blocks = capacity_blocks});
      executor = cpu_executor_.get();
    }
    engine_ = std::make_unique<engine::EngineCore>(engine_options, *executor, *this);
  }

  Status init() {
    // KV memory: a prefill instance's staging for one prompt; a decode instance's receive segment, sized for
    // its whole HBM KV capacity plus a block of slack per possible request rounding.
    if (prefill()) {
      kv_memory_bytes_ = (max_prompt_blocks_ + 1) * block_bytes_;
      auto publisher = KvEventPublisher::start(fmt::format("tcp://{}:0", options_.advertise_host),
                                               fmt::format("tcp://{}:0", options_.advertise_host), "",
                                               static_cast<size_t>(config_.serve.kv_event_buffer_batches),
                                               &*options_.secret);
      if (!publisher.ok()) return publisher.status();
      kv_events_ = std::move(*publisher);
      if (!options_.cache_file.empty()) CRESCENT_RETURN_IF_ERROR(open_cache_file());
    } else {
      // Reservations are held until their request finishes: room for the whole batch's prompts.
      const int64_t capacity_blocks =
          (cluster::decode_kv_capacity_tokens(config_) + block_tokens_ - 1) / block_tokens_;
      kv_memory_bytes_ =
          static_cast<uint64_t>(capacity_blocks + cluster::kDecodeRoundingBlocks) * block_bytes_;
      allocator_.emplace(kv_memory_bytes_);
    }
    auto memory = transfer_.allocate_memory(kv_memory_bytes_);
    if (!memory.ok()) return memory.status();
    kv_memory_ = static_cast<std::byte*>(*memory);
    if (!prefill()) {
      segment_ = fmt::format("{}-{}/kv", identity_, incarnation_);
      CRESCENT_RETURN_IF_ERROR(transfer_.expose_segment(segment_, kv_memory_, kv_memory_bytes_));
    }
    try {
      make_member_client(control_, *options_.secret);
      // Each incarnation has a routing id of its own: the Conductor tells a restarted instance from its
      // predecessor, and no connection takes over another's.
      control_.set(zmq::sockopt::routing_id, fmt::format("{}#{:x}", identity_, incarnation_));
      control_.set(zmq::sockopt::linger, 0);
      control_.set(zmq::sockopt::reconnect_ivl, 100);
      control_.set(zmq::sockopt::sndhwm, 0);  // never drop a report (tokens, prefill done) for a slow reader
      control_.set(zmq::sockopt::rcvhwm, 0);
      control_.connect(options_.conductor_endpoint);
      conductor_ = options_.conductor_endpoint;
    } catch (const zmq::error_t& e) {
      return Status::invalid_argument(
          fmt::format("cannot connect to the Conductor at '{}': {}", options_.conductor_endpoint, e.what()));
    }
    if (cpu_executor_) {
      // Forward passes compute on a thread of their own; this one keeps serving the control socket.
      cpu_executor_->compute_in_background(
          [this](int done_fd, int progress_fd) { serve_while_computing(done_fd, progress_fd); });
    }
    thread_ = std::thread([this] { run(); });
    return Status();
  }

  void begin_drain() { draining_ = true; }

  // With etcd: follows whichever Conductor leads. Every 200 ms a thread reads `key`; when it names
  // another control endpoint, the run thread reconnects there and says hello (the new leader resets this
  // instance, which then reports its whole cache).
  void follow_conductor(EtcdClient etcd, std::string key) {
    follow_thread_ = std::thread([this, etcd = std::move(etcd), key = std::move(key)] {
      constexpr auto kFollowPeriod = std::chrono::milliseconds(200);
      std::string last = options_.conductor_endpoint;
      while (!stopping_) {
        if (auto kv = etcd.get(key); kv.ok() && kv->has_value() && (*kv)->value != last) {
          last = (*kv)->value;
          std::lock_guard lock(conductor_mu_);
          next_conductor_ = last;
        }
        for (int i = 0; i < 10 && !stopping_; ++i) std::this_thread::sleep_for(kFollowPeriod / 10);
      }
    });
  }
  bool drained() const { return drained_; }

  ~Impl() override {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
    if (follow_thread_.joinable()) follow_thread_.join();
    if (!segment_.empty()) (void)transfer_.withdraw_segment(segment_);
  }

  // The prefix cache's file (InstanceOptions::cache_file): opened, and what a previous run left in it put
  // back in the engine's cache (the KV events announce it).
  Status open_cache_file() {
    const int64_t capacity_tokens =
        cluster::prefill_engine_options(config_, block_tokens_).kv_capacity_tokens;
    const kv::PersistentBlockFile::Identity identity{
        .model_seed = options_.cluster.block_key_seed,
        .block_size_tokens = block_tokens_,
        .block_bytes = cpu_executor_ ? block_bytes_ : 0};  // the mock's KV is a function of its key
    auto file = kv::PersistentBlockFile::open(options_.cache_file, identity,
                                              std::max<int64_t>(1, capacity_tokens / block_tokens_));
    if (!file.ok()) return file.status();
    cache_file_ = std::move(*file);
    const kv::PersistentBlockFile::Adopted& adopted = cache_file_->adopted();
    const int64_t held = engine_->adopt_prefix(adopted.keys);
    fmt::print("{}: cache file {}: adopted {} blocks{}{}\n", identity_, options_.cache_file, held,
               adopted.dropped > 0 ? fmt::format(", {} failed their check", adopted.dropped) : "",
               adopted.discarded.empty() ? "" : "; started afresh: " + adopted.discarded);
    std::fflush(stdout);
    return Status();
  }

  // ---- EngineListener ----
  void on_prefill_start(engine::RequestId id, double, const engine::PrefillStart& start) override {
    auto it = orders_.find(id);
    if (it == orders_.end()) return;
    Order& order = it->second;
    prefilling_ = id;
    order.reused_blocks = std::min<int64_t>(start.hit_tokens / block_tokens_, std::ssize(order.keys));
    order.computed_tokens = start.prefill_tokens;  // the mock's; the cpu executor's is its own count
    // The part of the arranged prefix this instance does not hold comes from the pool. What the pool did
    // not give (a miss, a block failing its check) is computed: with the cpu executor, from the first such
    // block on, so only the blocks before it count as reused.
    int64_t first = start.local_hit_tokens / block_tokens_;
    if (const int64_t held = import_from_cache_file(order, first); held < first) {
      first = held;  // computed from there: nothing after it is reused
      order.reused_blocks = held;
    }
    if (order.reused_blocks > first) {
      order.fetched_tokens_expected = (order.reused_blocks - first) * block_tokens_;
      const int64_t read = read_from_pool(order, first) - first;
      order.pool_hit_tokens = read * block_tokens_;
      order.pool_read_bytes = static_cast<uint64_t>(read) * block_bytes_;
      if (cpu_executor_) order.reused_blocks = first + read;
    }
    // The reused prefix can stream at once (but the last block waits for prefill done).
    order.computed_blocks = std::min(order.reused_blocks, blocks_of(std::ssize(order.token_ids)) - 1);
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kPrefillStart;
    m.request_id = id;
    // What was reused (the user's cached_tokens): with the cpu executor, short of the arranged prefix when
    // the pool missed.
    m.hit_tokens = start.hit_tokens;
    if (cpu_executor_) m.hit_tokens = std::min(m.hit_tokens, order.reused_blocks * block_tokens_);
    // At once, before the iteration computes: the decode instance's room (the KV target) comes back while
    // it does, so the KV can ship the moment the prefill ends.
    send(m);
  }

  // Its KV streams to decode while the prefill runs (paper §3.1 step 3): each chunk as its iteration ends.
  // The last block is left for prefill done.
  void on_prefill_chunk(engine::RequestId id, int64_t computed_tokens, double) override {
    auto it = orders_.find(id);
    if (it == orders_.end()) return;
    Order& order = it->second;
    order.computed_blocks =
        std::min(computed_tokens / block_tokens_, blocks_of(std::ssize(order.token_ids)) - 1);
    stream_kv(order);
  }

  void on_first_token(engine::RequestId id, double) override {
    auto it = orders_.find(id);
    if (it == orders_.end()) return;
    Order& order = it->second;
    order.computed = true;
    if (prefilling_ == id) prefilling_.reset();
    std::span<const model::TokenLogprobs> first_logprobs;
    if (cpu_executor_) {
      const std::span<const int32_t> output = cpu_executor_->output(id);
      if (output.empty()) {  // its executor could not run it (no free KV block)
        fail_prefill(id, fmt::format("{}: {}", identity_, cpu_executor_->error(id)));
        return;
      }
      order.first_token = output.front();
      order.computed_tokens = std::ssize(order.token_ids) - cpu_executor_->reused_tokens(id);
      first_logprobs = cpu_executor_->logprobs(id);  // empty unless its request asked
    } else {
      order.first_token = engine::mock_token(order.seed, order.output_offset);
    }
    // The first token goes out now, before the next iteration computes and whether or not the decode
    // instance's room is known yet; the KV follows (kPrefillDone).
    InstanceMessage first;
    first.kind = InstanceMessage::Kind::kFirstToken;
    first.request_id = id;
    first.first_token = order.first_token;
    if (!first_logprobs.empty()) first.logprobs.push_back(first_logprobs.front());
    send(first);
    if (order.output_tokens > 1 && !order.target) {
      keep_in_cache_file(order);
      write_to_pool(order);  // its KV ships when the decode instance's room is known (kKvTarget)
      return;
    }
    // Decode waits for this KV, nothing waits for the pool or the cache file: the KV ships and prefill done
    // is reported first, then the new blocks go to the file and the pool (kPoolWritten).
    finish_prefill(id, order, /*forget=*/false);
    keep_in_cache_file(order);
    write_to_pool(order);
    InstanceMessage written;
    written.kind = InstanceMessage::Kind::kPoolWritten;
    written.request_id = id;
    written.pool_write_bytes = order.pool_write_bytes;
    send(written);
    forget_order(id);
  }

  void on_finished(engine::RequestId id, double, const std::optional<engine::StepLog::Gaps>&) override {
    if (!prefill()) release(id);
  }

  void on_tokens(std::span<const engine::RequestId> ids, double) override {
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kTokens;
    m.request_ids.assign(ids.begin(), ids.end());
    m.tokens.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const engine::RequestId id = ids[i];
      auto it = expected_.find(id);
      int64_t token = 0;
      if (cpu_executor_) {
        const std::span<const int32_t> output = cpu_executor_->output(id);
        token = output.empty() ? 0 : output.back();
        // The logprobs of this step's token, for a request that asked (one per token after the first, which
        // came from the prefill).
        if (it != expected_.end() && it->second.top_logprobs != model::kNoLogprobs) {
          const std::span<const model::TokenLogprobs> logprobs = cpu_executor_->logprobs(id);
          if (!logprobs.empty() && logprobs.size() + 1 == output.size()) {
            m.logprob_rows.push_back(static_cast<uint32_t>(i));
            m.logprobs.push_back(logprobs.back());
          }
        }
      } else if (it != expected_.end()) {
        token = engine::mock_token(it->second.sampling.seed, it->second.tokens);
      }
      if (it != expected_.end()) ++it->second.tokens;
      m.tokens.push_back(token);
    }
    send(m);  // at once: a real executor's next step computes before the loop flushes again
    load_dirty_ = true;
  }

  void on_kv_timeout(engine::RequestId id, double) override {
    release(id);
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kKvTimeout;
    m.request_id = id;
    outbox_.push_back(std::move(m));
  }

  void on_kv_event(std::span<const BlockKey> stored, std::span<const BlockKey> removed, double) override {
    if (cache_file_) {
      for (BlockKey key : removed) cache_file_->remove(key);
    }
    KvEventBatch batch;
    batch.timestamp_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (!removed.empty()) {
      KvEvent e;
      e.kind = KvEvent::Kind::kRemoved;
      e.block_hashes.assign(removed.begin(), removed.end());
      e.medium = "CPU";
      batch.events.push_back(std::move(e));
    }
    if (!stored.empty()) {
      KvEvent e;
      e.kind = KvEvent::Kind::kStored;
      e.block_hashes.assign(stored.begin(), stored.end());
      e.block_size = block_tokens_;
      e.medium = "CPU";
      batch.events.push_back(std::move(e));
    }
    kv_events_->publish(batch);
  }

 private:
  // A prompt this prefill instance was given.
  struct Order {
    uint64_t id = 0;
    std::vector<int64_t> token_ids;
    std::vector<BlockKey> keys;  // full blocks
    int64_t output_tokens = 1;
    uint64_t seed = 0;                    // the mock's first token is a function of it
    int64_t output_offset = 0;            // and of the tokens the request gave before this placement
    int64_t first_token = 0;              // once computed
    int64_t reused_blocks = 0;            // full blocks not computed here
    int64_t fetched_tokens_expected = 0;  // of them, to be read from the pool
    int64_t pool_hit_tokens = 0;          // of those, read from the pool intact
    int64_t computed_tokens = 0;          // prompt tokens its executor computed (once computed)
    uint64_t pool_read_bytes = 0, pool_write_bytes = 0;
    bool computed = false;                  // its prefill ended
    std::optional<InstanceMessage> target;  // where its decode instance reserved room (kKvTarget)
    // Streaming to decode while the prefill runs (paper §3.1 step 3): the first computed_blocks exist, the
    // first shipped_blocks are at decode.
    int64_t computed_blocks = 0;
    int64_t shipped_blocks = 0;
    uint64_t shipped_bytes = 0;
    uint64_t shipped_writes = 0;
    // Layer by layer (ship_layers): of blocks [layer_blocks.first, .second), the first layers_shipped layers
    // are at decode.
    std::pair<int64_t, int64_t> layer_blocks{0, 0};
    int64_t layers_shipped = 0;
    std::string transport;  // what carried them (transfer::transport_name)
    Status ship_error;      // the first failed chunk write: the request fails at prefill done
  };
  // A request placed on this decode instance: its KV's block keys and how it samples.
  struct Expected {
    std::vector<BlockKey> keys;
    int64_t input_tokens = 0, output_tokens = 0;
    model::SamplingParams sampling;
    int32_t top_logprobs = model::kNoLogprobs;  // the cpu executor's tokens carry their logprobs
    int64_t tokens = 0;  // output tokens so far (the mock's next is mock_token(seed, tokens))
  };
  // Room a decode instance reserved for a request's KV.
  struct Reservation {
    uint64_t offset = 0, length = 0;
    int64_t blocks = 0;
    bool arrived = false;  // its KV is all here (kKvArrived): its prefill instance writes no more into it
  };
  // Room of a request dropped before its KV arrived, out of use until kRoomFree or `until_s`
  // (instance_wire.h, kHeldRoomTimeoutS).
  struct HeldRoom {
    uint64_t offset = 0, length = 0;
    double until_s = 0;
  };

  bool prefill() const { return options_.role == InstanceRole::kPrefill; }
  double now_s() const { return clock_.now_s(); }
  std::span<std::byte> block_at(int64_t i) const {
    return {kv_memory_ + static_cast<uint64_t>(i) * block_bytes_, block_bytes_};
  }
  int64_t blocks_of(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }

  // Reads blocks [first, order.reused_blocks) of `order` from the pool into staging and checks them; returns
  // how many blocks of the prefix are then here (first + the leading ones read intact).
  int64_t read_from_pool(const Order& order, int64_t first) {
    // The mock's blocks carry their check inside; real KV (the cpu executor's) carries a trailer beside it in
    // the pool (kv_blocks.h), read into a buffer of its own. A block that fails its check is a miss, counted.
    const bool trailed = cpu_executor_ != nullptr;
    const uint64_t stride = block_bytes_ + (trailed ? kKvBlockTrailerBytes : 0);
    std::vector<std::byte> pooled(trailed ? static_cast<size_t>(order.reused_blocks - first) * stride : 0);
    std::vector<std::string> names;
    std::vector<std::string_view> keys;
    std::vector<store::Buffer> out;
    for (int64_t b = first; b < order.reused_blocks; ++b) {
      names.push_back(store_->block_key(order.keys[static_cast<size_t>(b)]));
      out.push_back(trailed ? store::Buffer{pooled.data() + static_cast<uint64_t>(b - first) * stride, stride}
                            : store::Buffer{block_at(b).data(), block_bytes_});
    }
    for (const std::string& n : names) keys.push_back(n);
    auto got = store_->batch_get(keys, out);
    int64_t blocks = first;
    if (!got.ok()) return blocks;
    for (size_t i = 0; i < got->size(); ++i) {
      if (!(*got)[i].ok()) break;
      const int64_t b = first + static_cast<int64_t>(i);
      const BlockKey key = order.keys[static_cast<size_t>(b)];
      const std::span<const std::byte> read(static_cast<const std::byte*>(out[i].data), out[i].size_bytes);
      const bool intact = trailed ? *(*got)[i] == stride && kv_block_sealed(key, read.first(block_bytes_),
                                                                            read.subspan(block_bytes_))
                                  : kv_block_matches(key, read);
      if (!intact) {
        ++checksum_failures_;
        if (std::has_single_bit(checksum_failures_)) {
          fmt::print(stderr, "{}: KV block {} read from the pool failed its check ({} so far): not used\n",
                     identity_, store_->block_key(key), checksum_failures_);
        }
        break;
      }
      ++blocks_verified_;
      if (trailed && !cpu_executor_->import_block(order.id, b, read.first(block_bytes_)).ok()) break;
      ++blocks;
    }
    return blocks;
  }

  // Keeps the blocks of `order`'s prompt the engine's cache holds in the cache file, with their KV (the cpu
  // executor's bytes), once they are computed.
  void keep_in_cache_file(const Order& order) {
    if (!cache_file_) return;
    for (int64_t b = 0; b < std::ssize(order.keys); ++b) {
      const BlockKey key = order.keys[static_cast<size_t>(b)];
      if (cache_file_->contains(key) || !engine_->prefix_cache_contains(key)) continue;
      std::span<const std::byte> bytes;
      if (cpu_executor_) {
        bytes = cpu_executor_->kv_block(order.id, b);
        if (bytes.size() != block_bytes_) break;
      }
      cache_file_->put(key, bytes);
    }
  }

  // With the cpu executor, the blocks among `order`'s first `local` (the engine's cache holds them) whose KV
  // the executor lacks, because they were adopted from the cache file, are given to it from the file.
  // Returns how many leading blocks it then has: a block the file cannot give (it failed its check) and those
  // after it are computed.
  int64_t import_from_cache_file(const Order& order, int64_t local) {
    if (!cpu_executor_ || !cache_file_) return local;
    for (int64_t b = 0; b < local; ++b) {
      const BlockKey key = order.keys[static_cast<size_t>(b)];
      if (cpu_executor_->cached_block(key)) continue;
      std::optional<std::span<const std::byte>> bytes = cache_file_->bytes(key);
      if (!bytes || !cpu_executor_->import_block(order.id, b, *bytes).ok()) return b;
    }
    return local;
  }

  // Stores the full blocks this prefill computed in the pool, for other instances to reuse: real KV with its
  // trailer (read_from_pool checks it), the mock's as it is.
  void write_to_pool(Order& order) {
    const int64_t full = std::ssize(order.keys);
    if (order.reused_blocks >= full || full > max_prompt_blocks_) return;
    const bool trailed = cpu_executor_ != nullptr;
    const uint64_t stride = block_bytes_ + (trailed ? kKvBlockTrailerBytes : 0);
    std::vector<std::byte> pooled(trailed ? static_cast<size_t>(full - order.reused_blocks) * stride : 0);
    std::vector<store::ConstBuffer> blocks;
    for (int64_t b = order.reused_blocks; b < full; ++b) {
      const BlockKey key = order.keys[static_cast<size_t>(b)];
      fill_block(order, b, key);
      if (!trailed) {
        blocks.push_back({block_at(b).data(), block_bytes_});
        continue;
      }
      std::byte* at = pooled.data() + static_cast<uint64_t>(b - order.reused_blocks) * stride;
      std::ranges::copy(block_at(b), at);
      seal_kv_block(key, block_at(b), {at + block_bytes_, kKvBlockTrailerBytes});
      blocks.push_back({at, stride});
    }
    auto stored =
        store_->put_blocks(std::span(order.keys).subspan(static_cast<size_t>(order.reused_blocks)), blocks);
    if (!stored.ok()) return;  // the pool is a cache: the request goes on without it
    for (const Status& s : *stored) order.pool_write_bytes += s.ok() ? stride : 0;
  }

  // Puts block `b` of `order`'s prompt KV (key `key`) in staging: the cpu executor's bytes, or the mock's
  // payload of the key.
  void fill_block(const Order& order, int64_t b, BlockKey key) {
    if (!cpu_executor_) {
      fill_kv_block(key, block_at(b));
      return;
    }
    const std::span<const std::byte> kv = cpu_executor_->kv_block(order.id, b);
    assert(kv.size() == block_bytes_);
    std::ranges::copy(kv, block_at(b).begin());
  }

  // Ships what is left of the prompt's KV to its decode instance's reservation (when it decodes) and reports
  // the prefill done; a failed write (now or while streaming) is reported as the request's error. `forget`
  // false: the report goes out at once and the caller drops the order (after its pool write).
  void finish_prefill(uint64_t id, Order& order, bool forget = true) {
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kPrefillDone;
    m.request_id = id;
    m.pool_hit_tokens = order.pool_hit_tokens;
    m.computed_tokens = order.computed_tokens;
    m.fetched_tokens_expected = order.fetched_tokens_expected;
    m.pool_read_bytes = order.pool_read_bytes;
    m.pool_write_bytes = order.pool_write_bytes;
    if (order.output_tokens > 1) {
      // What was not streamed while the prefill ran: the last chunk (or all of it, when the decode instance's
      // room was known late).
      ship(order, blocks_of(std::ssize(order.token_ids)));
      if (order.ship_error.ok()) {
        m.kv_bytes = order.shipped_bytes;
        m.kv_chunks = order.shipped_writes;
        m.kv_transport = order.transport;
      } else {
        m.error = order.ship_error.message();
      }
    }
    if (forget) {
      outbox_.push_back(std::move(m));
      forget_order(id);
    } else {
      send(m);  // at once, before the caller's pool write
    }
  }

  // A prefill that cannot go on: reported done with `error`.
  void fail_prefill(uint64_t id, const std::string& error) {
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kPrefillDone;
    m.request_id = id;
    m.error = error;
    outbox_.push_back(std::move(m));
    forget_order(id);
  }

  // Prefill: drops order `id` and the KV its executor kept for shipping (once the forward pass under way,
  // if any, is done: the executor is not called into meanwhile).
  void forget_order(uint64_t id) {
    orders_.erase(id);
    if (!cpu_executor_) return;
    if (computing_) {
      drops_after_compute_.push_back(id);
    } else {
      cpu_executor_->drop(id);
    }
  }

  // Streams what is computed of `order`'s prompt and not yet at its decode instance, once that instance's
  // room is known (a prompt whose room comes late catches up here).
  void stream_kv(Order& order) {
    if (order.output_tokens <= 1 || !order.target || order.computed) return;
    ship(order, order.computed_blocks);
  }

  // Whether `order`'s prompt KV fits the room its decode instance reserved (else order.ship_error says so).
  bool fits_reservation(Order& order) {
    const int64_t blocks = blocks_of(std::ssize(order.token_ids));
    if (blocks <= max_prompt_blocks_ + 1 &&
        static_cast<uint64_t>(blocks) * block_bytes_ == order.target->length_bytes) {
      return true;
    }
    order.ship_error = Status::invalid_argument(fmt::format(
        "KV of {} blocks does not match the reservation of {} bytes", blocks, order.target->length_bytes));
    return false;
  }

  // Writes `regions` (offset, bytes) of the prompt's KV, filled in staging at the same offsets, into its
  // decode instance's room through the transfer engine, in one batch. A failure is kept in
  // order.ship_error (and returned false).
  bool write_kv(Order& order, std::span<const std::pair<uint64_t, uint64_t>> regions) {
    auto segment = transfer_.open_segment(order.target->segment);
    if (!segment.ok()) {
      order.ship_error = segment.status();
      return false;
    }
    if (auto kind = transfer_.segment_transport(*segment); kind.ok()) {
      order.transport = std::string(transfer::transport_name(*kind));
    }
    auto batch = transfer_.allocate_batch(regions.size());
    if (!batch.ok()) {
      order.ship_error = batch.status();
      return false;
    }
    std::vector<transfer::TransferRequest> requests;
    uint64_t bytes = 0;
    for (const auto& [offset, length] : regions) {
      requests.push_back({.op = transfer::TransferOp::kWrite,
                          .local_address = kv_memory_ + offset,
                          .segment = *segment,
                          .offset_bytes = order.target->offset_bytes + offset,
                          .length_bytes = length});
      bytes += length;
    }
    Status submitted = transfer_.submit(*batch, requests);
    Result<transfer::BatchSummary> summary =
        submitted.ok() ? transfer_.wait(*batch, kTransferTimeout) : Result<transfer::BatchSummary>(submitted);
    if (!summary.ok()) {
      order.ship_error = summary.status();
    } else if (summary->completed != regions.size()) {
      std::string error = "timed out";
      for (size_t i = 0; i < regions.size(); ++i) {
        if (auto status = transfer_.status(*batch, i); status.ok() && !status->error.empty()) {
          error = status->error;
          break;
        }
      }
      order.ship_error =
          Status::unavailable(fmt::format("writing KV to {} failed: {}", order.target->segment, error));
    }
    if (summary.ok() && summary->pending() == 0) (void)transfer_.free_batch(*batch);
    if (!order.ship_error.ok()) return false;
    order.shipped_bytes += bytes;
    ++order.shipped_writes;
    return true;
  }

  // Writes blocks [order.shipped_blocks, to_block) of the prompt's KV into its decode instance's room
  // (each filled just before: the staging memory is shared by every order). A failure is kept in
  // order.ship_error and stops further writes.
  void ship(Order& order, int64_t to_block) {
    if (!order.ship_error.ok() || to_block <= order.shipped_blocks || !fits_reservation(order)) return;
    const std::vector<BlockKey> keys =
        kv::shipped_block_keys(order.token_ids, block_tokens_, options_.cluster.block_key_seed);
    for (int64_t b = order.shipped_blocks; b < to_block; ++b)
      fill_block(order, b, keys[static_cast<size_t>(b)]);
    const uint64_t offset = static_cast<uint64_t>(order.shipped_blocks) * block_bytes_;
    const uint64_t bytes = static_cast<uint64_t>(to_block - order.shipped_blocks) * block_bytes_;
    const std::pair<uint64_t, uint64_t> region{offset, bytes};
    if (write_kv(order, std::span(&region, 1))) order.shipped_blocks = to_block;
  }

  // Layer by layer (paper §3.1 step 3): while the cpu executor's forward pass computes a chunk of the prompt
  // being prefilled, each layer's KV of the blocks that chunk completes (and of earlier ones not shipped yet)
  // goes to decode as soon as the pass has written it, so when the pass ends only its last layer's write is
  // left to wait for. Called as layers are stored (serve_while_computing).
  void ship_layers() {
    if (!config_.serve.kv_stream_layers) return;
    const model::CpuExecutor::PassInFlight& pass = cpu_executor_->pass_in_flight();
    if (!pass.prefill_request) return;
    auto it = orders_.find(*pass.prefill_request);
    if (it == orders_.end()) return;
    Order& order = it->second;
    if (order.output_tokens <= 1 || !order.target || !order.ship_error.ok()) return;
    const int64_t n = std::ssize(order.token_ids);
    const int64_t end_block =
        pass.prefill_end_tokens == n ? blocks_of(n) : pass.prefill_end_tokens / block_tokens_;
    if (end_block <= order.shipped_blocks || !fits_reservation(order)) return;
    if (order.layer_blocks != std::pair{order.shipped_blocks, end_block}) {
      order.layer_blocks = {order.shipped_blocks, end_block};
      order.layers_shipped = 0;
    }
    const int64_t stored = cpu_executor_->layers_stored();
    if (stored <= order.layers_shipped) return;
    const uint64_t layer_bytes = block_bytes_ / static_cast<uint64_t>(layers_);
    const uint64_t from = static_cast<uint64_t>(order.layers_shipped) * layer_bytes;
    const uint64_t length = static_cast<uint64_t>(stored - order.layers_shipped) * layer_bytes;
    std::vector<std::pair<uint64_t, uint64_t>> regions;
    for (int64_t b = order.shipped_blocks; b < end_block; ++b) {
      // Layers [layers_shipped, stored) of block b: contiguous ([layer][K, V][head][token][dim]).
      const std::span<const std::byte> kv = cpu_executor_->kv_block(order.id, b).subspan(from, length);
      std::ranges::copy(kv, block_at(b).begin() + static_cast<std::ptrdiff_t>(from));
      regions.emplace_back(static_cast<uint64_t>(b) * block_bytes_ + from, length);
    }
    if (!write_kv(order, regions)) return;
    order.layers_shipped = stored;
    if (stored == layers_) {
      order.shipped_blocks = end_block;
      order.layer_blocks = {0, 0};
      order.layers_shipped = 0;
    }
  }

  // Decode: forgets request `id` (its block keys, and the room it held: at once when its KV had all arrived,
  // else once its prefill instance writes no more there, kRoomFree).
  void release(uint64_t id) {
    expected_.erase(id);
    auto it = reservations_.find(id);
    if (it == reservations_.end()) return;
    if (it->second.arrived) {
      allocator_->free(it->second.offset, it->second.length);
    } else {
      held_rooms_[id] = {it->second.offset, it->second.length, now_s() + kHeldRoomTimeoutS};
    }
    reservations_.erase(it);
    load_dirty_ = true;
  }

  // Decode: the room held for dropped request `id` may be used again.
  void free_held_room(uint64_t id) {
    auto it = held_rooms_.find(id);
    if (it == held_rooms_.end()) return;
    allocator_->free(it->second.offset, it->second.length);
    held_rooms_.erase(it);
    load_dirty_ = true;
  }

  // Decode: rooms held past kHeldRoomTimeoutS are used again (said in the log: a prefill instance that
  // comes back later still writing there would overwrite another request's KV, which its check refuses).
  void expire_held_rooms() {
    if (held_rooms_.empty()) return;
    const double now = now_s();
    std::vector<uint64_t> expired;
    for (const auto& [id, room] : held_rooms_) {
      if (now >= room.until_s) expired.push_back(id);
    }
    for (uint64_t id : expired) {
      fmt::print(stderr,
                 "{}: the room of dropped request {} is used again after {:g} s without word that its "
                 "prefill instance writes no more there\n",
                 identity_, id, kHeldRoomTimeoutS);
      free_held_room(id);
    }
  }

  // Prefill: drops order `id` before its prefill is done (cancelled, or a reset), and tells the Conductor it
  // writes no more of its KV when it had a room at decode to write to (kKvWritesEnded).
  void drop_order(uint64_t id) {
    auto it = orders_.find(id);
    if (it == orders_.end()) return;
    if (it->second.target) {
      InstanceMessage ended;
      ended.kind = InstanceMessage::Kind::kKvWritesEnded;
      ended.request_id = id;
      outbox_.push_back(std::move(ended));
    }
    forget_order(id);
  }

  void handle(const InstanceMessage& m) {
    const double now = now_s();
    // The mock's engine is brought to now first, so events keep their exact order. A real executor's
    // advance computes the next iteration, which must not come between a message and its handling (a KV
    // target would wait for another prompt's prefill): the loop advances it once the messages are handled,
    // and an order given meanwhile joins at the next iteration boundary.
    if (!cpu_executor_) engine_->advance_until(now);
    switch (m.kind) {
      case InstanceMessage::Kind::kPrefill: {
        if (!prefill()) break;
        const auto input = std::ssize(m.token_ids);
        if (orders_.contains(m.request_id)) break;  // a duplicate: the first is under way
        // The staging memory holds one prompt of up to a decode instance's capacity (as the Conductor
        // admits).
        if (input < 1 || blocks_of(input) > max_prompt_blocks_ + 1 || m.output_offset < 0 ||
            m.reused_tokens < 0 || m.reused_tokens > input || m.fetched_tokens < 0 ||
            m.fetched_tokens > m.reused_tokens || !(m.ready_in_s >= 0 && m.ready_in_s < 1e9)) {
          InstanceMessage done;
          done.kind = InstanceMessage::Kind::kPrefillDone;
          done.request_id = m.request_id;
          done.error = fmt::format("{}: refused a malformed prefill order ({} tokens)", identity_, input);
          outbox_.push_back(std::move(done));
          break;
        }
        std::vector<BlockKey> keys =
            kv::prompt_block_keys(m.token_ids, block_tokens_, options_.cluster.block_key_seed);
        if (cpu_executor_) {
          Status added = cpu_executor_->add_request(
              m.request_id, {.prompt = std::vector<int32_t>(m.token_ids.begin(), m.token_ids.end()),
                             .block_keys = keys,
                             .output_tokens = 1,
                             .sampling = {.temperature = m.temperature,
                                          .top_p = m.top_p,
                                          .seed = m.seed,
                                          .tokens_before = m.output_offset},
                             .keep_after_release = true,
                             .top_logprobs = m.top_logprobs});
          if (!added.ok()) {
            InstanceMessage done;
            done.kind = InstanceMessage::Kind::kPrefillDone;
            done.request_id = m.request_id;
            done.error = fmt::format("{}: {}", identity_, added.message());
            outbox_.push_back(std::move(done));
            break;
          }
        }
        Order& order = orders_[m.request_id];
        order.id = m.request_id;
        order.token_ids = m.token_ids;
        order.keys = std::move(keys);
        order.output_tokens = m.output_tokens;
        order.seed = m.seed;
        order.output_offset = m.output_offset;
        engine_->submit_prompt(m.request_id, input, 1, order.keys, now,
                               {.reused_tokens = m.reused_tokens,
                                .fetched_tokens = m.fetched_tokens,
                                .ready_s = now + m.ready_in_s});
        break;
      }
      case InstanceMessage::Kind::kKvTarget: {
        auto it = orders_.find(m.request_id);
        if (it == orders_.end()) break;
        it->second.target = m;
        if (it->second.computed) finish_prefill(m.request_id, it->second);
        break;
      }
      case InstanceMessage::Kind::kExpect:
        if (prefill() || m.output_tokens < 2 || m.input_tokens < 1 || m.output_offset < 0 ||
            expected_.contains(m.request_id) || std::ssize(m.block_keys) != blocks_of(m.input_tokens) ||
            blocks_of(m.input_tokens) > max_prompt_blocks_ + 1 ||
            m.input_tokens + m.output_tokens > engine_->decode_load().kv_capacity_tokens) {
          break;  // malformed or duplicate: the Conductor never sends one (its request then times out there)
        }
        expected_[m.request_id] = {
            .keys = m.block_keys,
            .input_tokens = m.input_tokens,
            .output_tokens = m.output_tokens,
            .sampling = {.temperature = m.temperature,
                         .top_p = m.top_p,
                         .seed = m.seed,
                         .tokens_before = m.output_offset},
            .top_logprobs = m.top_logprobs,
        };
        engine_->expect(m.request_id, m.input_tokens, m.output_tokens, now);
        // Held while its prompt waits for prefill (a queue of any length): the Conductor cancels it if its
        // prefill instance goes down, and kKvComing starts the timeout once the prefill has started.
        engine_->set_kv_deadline(m.request_id, std::numeric_limits<double>::infinity());
        load_dirty_ = true;
        break;
      case InstanceMessage::Kind::kKvComing: {
        // Its prefill started: room for its KV is taken now (not at placement, so prompts queued for prefill
        // hold no memory here), and the KV must arrive within the timeout after the prefill's predicted end.
        if (prefill() || reservations_.contains(m.request_id)) break;  // not ours, or a duplicate
        if (!engine_->set_kv_deadline(m.request_id,
                                      now + m.ready_in_s + config_.serve.kv_transfer_timeout_s)) {
          InstanceMessage error;  // its prefill instance must not wait for a target that never comes
          error.kind = InstanceMessage::Kind::kKvError;
          error.request_id = m.request_id;
          error.error = fmt::format("{}: request {} is not expected here", identity_, m.request_id);
          outbox_.push_back(std::move(error));
          break;
        }
        InstanceMessage reply;
        reply.request_id = m.request_id;
        const int64_t blocks = blocks_of(m.input_tokens);
        const uint64_t length = static_cast<uint64_t>(blocks) * block_bytes_;
        std::optional<uint64_t> offset = allocator_->allocate(length);
        if (!offset) {
          reply.kind = InstanceMessage::Kind::kKvError;
          reply.error = fmt::format("{}: no room for {} KV bytes", identity_, length);
        } else {
          reservations_[m.request_id] = {*offset, length, blocks};
          reply.kind = InstanceMessage::Kind::kReserved;
          reply.segment = segment_;
          reply.offset_bytes = *offset;
          reply.length_bytes = length;
        }
        outbox_.push_back(std::move(reply));
        break;
      }
      case InstanceMessage::Kind::kKvArrived: {
        auto it = reservations_.find(m.request_id);
        auto expected = expected_.find(m.request_id);
        if (it == reservations_.end() || expected == expected_.end()) break;
        it->second.arrived = true;
        if (cpu_executor_) {
          // The KV is real (no checksum inside): it moves into the executor's blocks as it came.
          const Expected& e = expected->second;
          Status added = cpu_executor_->add_decoding(
              m.request_id,
              {.prompt_tokens = e.input_tokens,
               .first_token = static_cast<int32_t>(m.first_token),
               .output_tokens = e.output_tokens,
               .sampling = e.sampling,
               .top_logprobs = e.top_logprobs},
              std::span<const std::byte>(kv_memory_ + it->second.offset, it->second.length));
          if (!added.ok()) {
            InstanceMessage error;
            error.kind = InstanceMessage::Kind::kKvError;
            error.request_id = m.request_id;
            error.error = fmt::format("{}: {}", identity_, added.message());
            outbox_.push_back(std::move(error));
            engine_->cancel(m.request_id);
            release(m.request_id);
            return;
          }
        } else if (config_.serve.verify_kv_checksums) {
          for (int64_t b = 0; b < it->second.blocks; ++b) {
            const std::span<const std::byte> block(
                kv_memory_ + it->second.offset + static_cast<uint64_t>(b) * block_bytes_, block_bytes_);
            if (!kv_block_matches(expected->second.keys[static_cast<size_t>(b)], block)) {
              ++checksum_failures_;
              InstanceMessage error;
              error.kind = InstanceMessage::Kind::kKvError;
              error.request_id = m.request_id;
              error.error = fmt::format(
                  "{}: KV block {} of request {} failed its check (checksum, or not this prompt's block)",
                  identity_, b, m.request_id);
              outbox_.push_back(std::move(error));
              engine_->cancel(m.request_id);
              release(m.request_id);
              return;
            }
            ++blocks_verified_;
          }
        }
        // The first came from the prefill (after those the request gave before this placement).
        expected->second.tokens = 1 + expected->second.sampling.tokens_before;
        engine_->submit_decode(m.request_id, now, now);
        break;
      }
      case InstanceMessage::Kind::kDrainAck:
        drain_acked_ = true;
        break;
      case InstanceMessage::Kind::kCacheReport:
        publish_whole_cache();
        break;
      case InstanceMessage::Kind::kReset:
        drain_acked_ = false;  // a Conductor that did not know we drain (a new one): it acknowledges anew
        engine_->cancel_all();
        while (!orders_.empty()) drop_order(orders_.begin()->first);
        prefilling_.reset();
        while (!reservations_.empty()) release(reservations_.begin()->first);
        expected_.clear();
        load_dirty_ = true;
        publish_whole_cache();
        break;
      case InstanceMessage::Kind::kCancel:
        engine_->cancel(m.request_id);
        drop_order(m.request_id);
        if (prefilling_ == m.request_id) prefilling_.reset();
        release(m.request_id);
        load_dirty_ = true;
        break;
      case InstanceMessage::Kind::kRoomFree:
        free_held_room(m.request_id);
        break;
      default:
        break;  // instance → Conductor kinds: not for us
    }
  }

  // A Conductor that (re)starts following this instance learns its whole cache, not only what the replay
  // buffer still holds: one batch, [AllBlocksCleared, BlockStored(every cached key)], ordered with every
  // other event (a subscriber replaying from an older batch, or from a gap, reaches it too).
  void publish_whole_cache() {
    if (!kv_events_) return;
    KvEventBatch batch;
    batch.timestamp_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    KvEvent& cleared = batch.events.emplace_back();
    cleared.kind = KvEvent::Kind::kAllCleared;
    std::vector<BlockKey> keys = engine_->prefix_cache_keys();
    if (!keys.empty()) {
      KvEvent& stored = batch.events.emplace_back();
      stored.kind = KvEvent::Kind::kStored;
      stored.block_hashes = std::move(keys);  // in no particular order: a set, not a prefix
      stored.block_size = block_tokens_;
      stored.medium = "CPU";
    }
    kv_events_->publish(batch);
  }

  InstanceMessage load_report(InstanceMessage::Kind kind) const {
    InstanceMessage m;
    m.kind = kind;
    m.role = options_.role;
    m.index = options_.index;
    m.incarnation = incarnation_;
    if (kv_events_) {
      m.kv_events_endpoint = kv_events_->endpoint();
      m.kv_replay_endpoint = kv_events_->replay_endpoint();
    }
    m.load = engine_->decode_load();
    m.kv_capacity_tokens = m.load.kv_capacity_tokens;
    m.outstanding = engine_->outstanding();
    m.draining = draining_;
    m.blocks_verified = blocks_verified_;
    m.checksum_failures = checksum_failures_;
    return m;
  }

  void send(const InstanceMessage& m) {
    const std::string bytes = encode(m);
    // DEALER queues while the Conductor is away (no high-water mark); a Conductor that comes back resets us.
    if (!control_.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
      fmt::print(stderr, "{}: could not queue a message for the Conductor\n", identity_);
    }
  }

  // Streams what the prompt being prefilled has computed, sends what the engine's events queued, and the
  // load report when it changed or is due (the heartbeat).
  void flush() {
    if (prefilling_) {
      if (auto it = orders_.find(*prefilling_); it != orders_.end()) stream_kv(it->second);
    }
    send_outbox();
    const double now = now_s();
    if (load_dirty_ || now >= next_load_s_) {
      last_load_ = load_report(InstanceMessage::Kind::kLoad);
      send(last_load_);
      load_dirty_ = false;
      next_load_s_ = now + kLoadPeriodS;
    }
  }

  void send_outbox() {
    for (const InstanceMessage& m : outbox_) send(m);
    outbox_.clear();
  }

  // Handles the control messages that came (a burst at most: those queued now).
  void receive() {
    for (;;) {
      zmq::message_t message;
      if (!control_.recv(message, zmq::recv_flags::dontwait)) break;
      auto decoded = decode_instance_message(message.to_string_view());
      if (!decoded.ok()) {
        // Logged the first time and at every power of two: a flood writes a few lines, not one each.
        if (const uint64_t n = ++malformed_messages_; (n & (n - 1)) == 0) {
          fmt::print(stderr, "{}: dropped a malformed control message ({} so far): {}\n", identity_, n,
                     decoded.status().message());
        }
        continue;
      }
      if (computing_) {
        handle_while_computing(std::move(*decoded));
        continue;
      }
      handle(*decoded);
      // What it produced, and the heartbeat, go out before the next message is handled, not after a burst.
      flush();
    }
  }

  // A control message that came while a forward pass computes. A KV target is acted on at once: the
  // prompt's KV computed so far (all of it, when its prefill has ended) ships while the next iteration
  // computes, not after it. The rest needs the engine and waits for the pass's end, in order.
  void handle_while_computing(InstanceMessage m) {
    if (m.kind == InstanceMessage::Kind::kKvTarget) {
      if (auto it = orders_.find(m.request_id); it != orders_.end()) {
        Order& order = it->second;
        order.target = m;
        if (order.computed) {
          finish_prefill(m.request_id, order);
        } else {
          stream_kv(order);  // the blocks of chunks computed in earlier iterations: they do not change
          ship_layers();     // and the layers of this pass written so far
        }
        return;
      }
    }
    deferred_.push_back(std::move(m));
  }

  // Runs on this thread while the cpu executor's forward pass computes on its own (until `done_fd` is
  // readable): the control socket is served, what is queued goes out, and the heartbeat keeps its period
  // whatever an iteration takes (with the load as it was when the iteration started).
  void serve_while_computing(int done_fd, int progress_fd) {
    computing_ = true;
    zmq::pollitem_t items[3] = {{control_.handle(), 0, ZMQ_POLLIN, 0},
                                {nullptr, progress_fd, ZMQ_POLLIN, 0},
                                {nullptr, done_fd, ZMQ_POLLIN, 0}};
    for (;;) {
      switch_conductor();  // a long forward pass does not delay following a new leader
      send_outbox();
      if (const double now = now_s(); now >= next_load_s_) {
        send(last_load_);
        next_load_s_ = now + kLoadPeriodS;
      }
      const double wait_ms = std::clamp((next_load_s_ - now_s()) * 1000, 0.0, 50.0);
      zmq::poll(items, 3, std::chrono::milliseconds(static_cast<int64_t>(std::ceil(wait_ms))));
      if ((items[0].revents & ZMQ_POLLIN) != 0) receive();
      if ((items[1].revents & ZMQ_POLLIN) != 0) {
        uint64_t layers = 0;
        (void)!::read(progress_fd, &layers, sizeof layers);
        ship_layers();
      }
      if ((items[2].revents & ZMQ_POLLIN) != 0) break;
    }
    computing_ = false;
  }

  // After an engine advance: what waited for the forward pass to end.
  void catch_up() {
    for (uint64_t id : drops_after_compute_) cpu_executor_->drop(id);
    drops_after_compute_.clear();
    std::vector<InstanceMessage> deferred;
    deferred.swap(deferred_);
    for (const InstanceMessage& m : deferred) {
      handle(m);
      flush();
    }
  }

  // Whether nothing is left here: no prompt queued or computing, no room reserved, no request decoding, and
  // nothing waiting to be sent.
  bool idle() const {
    return orders_.empty() && reservations_.empty() && expected_.empty() && engine_->outstanding() == 0 &&
           outbox_.empty() && deferred_.empty();
  }

  // Draining: says so at once (every report says it from now on), and is done once the Conductor has
  // acknowledged (no new request follows; or it has not answered within kDrainAckWaitS: it may be gone) and
  // nothing is left. What was sent meanwhile still goes out when the socket closes (linger).
  void check_drain() {
    if (!draining_ || drained_) return;
    const double now = now_s();
    if (drain_started_s_ < 0) {
      drain_started_s_ = now;
      load_dirty_ = true;  // the Conductor hears it with the next report, now
      return;
    }
    if ((drain_acked_ || now - drain_started_s_ > kDrainAckWaitS) && idle()) {
      control_.set(zmq::sockopt::linger, kDrainLingerMs);
      drained_ = true;
    }
  }

  // Another Conductor leads (follow_conductor): the control socket goes to it.
  void switch_conductor() {
    std::string next;
    {
      std::lock_guard lock(conductor_mu_);
      next.swap(next_conductor_);
    }
    if (next.empty() || next == conductor_) return;
    try {
      control_.disconnect(conductor_);
    } catch (const zmq::error_t&) {
      // not connected there (any more): nothing to undo
    }
    try {
      control_.connect(next);
    } catch (const zmq::error_t& e) {
      fmt::print(stderr, "{}: cannot connect to the Conductor at '{}': {}\n", identity_, next, e.what());
      return;
    }
    fmt::print("{}: following the Conductor at {} (it leads now)\n", identity_, next);
    std::fflush(stdout);
    conductor_ = std::move(next);
    send(load_report(InstanceMessage::Kind::kHello));
  }

  void run() {
    last_load_ = load_report(InstanceMessage::Kind::kLoad);
    send(load_report(InstanceMessage::Kind::kHello));
    next_load_s_ = now_s() + kLoadPeriodS;
    zmq::pollitem_t item{control_.handle(), 0, ZMQ_POLLIN, 0};
    while (!stopping_) {
      switch_conductor();
      engine_->advance_until(now_s());
      catch_up();
      expire_held_rooms();
      check_drain();
      flush();
      if (!deferred_.empty()) continue;
      const double next = std::min(engine_->next_event_s(), next_load_s_);
      const double wait_ms = std::clamp((next - now_s()) * 1000, 0.0, 50.0);
      zmq::poll(&item, 1, std::chrono::milliseconds(static_cast<int64_t>(std::ceil(wait_ms))));
      receive();
    }
  }

  const InstanceOptions options_;
  const cluster::ClusterConfig config_;
  const int64_t block_tokens_;
  const perf::CostModel cost_;
  engine::MockExecutor mock_executor_;
  std::unique_ptr<model::LlamaForward> model_;        // the cpu executor's
  std::unique_ptr<model::CpuExecutor> cpu_executor_;  // or the mock's
  std::unique_ptr<engine::EngineCore> engine_;
  std::unique_ptr<store::Client> store_;                    // prefill: the KV cache pool
  std::unique_ptr<transfer::TransferEngine> own_transfer_;  // decode: its engine (prefill: the store's)
  transfer::TransferEngine& transfer_;                      // what moves KV bytes
  std::unique_ptr<KvEventPublisher> kv_events_;             // prefill
  std::unique_ptr<kv::PersistentBlockFile> cache_file_;     // prefill with InstanceOptions::cache_file
  const uint64_t block_bytes_;
  const int64_t layers_;  // the cpu executor's model's (a block holds them back to back); the mock: 1
  const int64_t max_prompt_blocks_;
  const uint64_t incarnation_;
  const std::string identity_;
  std::byte* kv_memory_ = nullptr;  // prefill: staging for one prompt; decode: the receive segment
  uint64_t kv_memory_bytes_ = 0;
  std::string segment_;                                // decode: the receive segment's name
  std::optional<store::SegmentAllocator> allocator_;   // decode: reservations within it
  std::unordered_map<uint64_t, HeldRoom> held_rooms_;  // decode: rooms of dropped requests, by request id
  zmq::context_t context_;
  zmq::socket_t control_;
  const SteadyClock clock_;
  std::unordered_map<uint64_t, Order> orders_;              // prefill
  std::unordered_map<uint64_t, Reservation> reservations_;  // decode
  std::unordered_map<uint64_t, Expected> expected_;         // decode
  std::vector<InstanceMessage> outbox_;
  // While the cpu executor's forward pass computes (serve_while_computing): messages that need the engine,
  // and executor requests to drop, wait for its end; the heartbeat repeats the last load report.
  bool computing_ = false;
  std::vector<InstanceMessage> deferred_;
  std::vector<uint64_t> drops_after_compute_;
  InstanceMessage last_load_;
  std::optional<uint64_t> prefilling_;  // prefill: the order whose prompt is being computed
  bool load_dirty_ = false;
  double next_load_s_ = 0;                                // the next load report (heartbeat) is due then
  uint64_t checksum_failures_ = 0, blocks_verified_ = 0;  // since this process started
  uint64_t malformed_messages_ = 0;                       // control messages that could not be decoded
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};  // begin_drain() was called
  std::atomic<bool> drained_{false};   // the drain is done: the instance may leave
  std::string conductor_;              // the control endpoint connected to (the run thread's)
  std::mutex conductor_mu_;
  std::string next_conductor_;  // under conductor_mu_: where the leading Conductor is now, when it changed
  std::thread follow_thread_;
  double drain_started_s_ = -1;  // when the run thread saw draining_ (its clock)
  bool drain_acked_ = false;     // the Conductor saw it draining (kDrainAck since the last reset)
  std::thread thread_;
};

Result<std::unique_ptr<InstanceServer>> InstanceServer::start(const InstanceOptions& options) {
  const cluster::ClusterConfig& config = options.cluster.config;
  CRESCENT_RETURN_IF_ERROR(validate(options.cluster));
  if (!options.secret) {
    return Status::invalid_argument("an instance joins its Conductor as a member: give the cluster secret");
  }
  const bool prefill = options.role == InstanceRole::kPrefill;
  if (prefill && options.store_master.empty() && options.etcd_endpoint.empty()) {
    return Status::invalid_argument(
        "a prefill instance needs the store master (--store-master HOST:PORT, or --etcd to find it there)");
  }
  InstanceOptions resolved = options;
  std::optional<EtcdClient> etcd;
  if (!options.etcd_endpoint.empty()) {
    auto created = EtcdClient::create(options.etcd_endpoint, std::chrono::seconds(2));
    if (!created.ok()) return created.status();
    etcd = *created;
    if (resolved.conductor_endpoint.empty()) {
      auto endpoint =
          wait_for_etcd_value(*etcd, etcd_conductor_key(options.etcd_prefix), std::chrono::seconds(20));
      if (!endpoint.ok()) return endpoint.status();
      resolved.conductor_endpoint = *endpoint;
    }
  }
  if (resolved.advertise_host.empty()) {
    // The interface the Conductor is reached through is the one it (and the other members) reach us on.
    auto conductor = net::url_host_port(resolved.conductor_endpoint);
    if (!conductor.ok()) return conductor.status();
    auto local = net::local_address_toward(conductor->first, conductor->second);
    if (!local.ok()) {
      return Status(local.status().code(),
                    fmt::format("finding this instance's address toward the Conductor at {}: {} (give "
                                "--advertise-host)",
                                resolved.conductor_endpoint, local.status().message()));
    }
    resolved.advertise_host = *local;
  }
  if (resolved.transfer_metadata.empty()) {
    resolved.transfer_metadata = etcd ? "etcd:" + options.etcd_endpoint : transfer::default_metadata_spec();
  }
  const std::string name = fmt::format("{}-{}", to_string(options.role), options.index);
  std::unique_ptr<store::Client> client;
  std::unique_ptr<transfer::TransferEngine> engine;
  if (prefill) {
    store::ClientOptions client_options;
    client_options.master.address = options.store_master;
    if (options.store_master.empty()) {  // the leading master, in etcd (followed through a failover)
      client_options.master.etcd.endpoint = options.etcd_endpoint;
      client_options.master.etcd.prefix = options.store_etcd_prefix;
    }
    client_options.master.secret = options.secret;  // the pool admits members only
    client_options.staging_bytes = 4 << 20;         // KV buffers are registered: staging is for nothing else
    client_options.tcp_host = resolved.advertise_host;
    auto created = store::Client::create(client_options);
    if (!created.ok()) {
      return Status(created.status().code(),
                    fmt::format("connecting to the store master {}: {}",
                                options.store_master.empty() ? "leading in etcd " + options.etcd_endpoint +
                                                                   " under " + options.store_etcd_prefix
                                                             : "at " + options.store_master,
                                created.status().message()));
    }
    client = std::move(*created);
  } else {
    auto metadata = transfer::open_metadata(resolved.transfer_metadata);
    if (!metadata.ok()) return metadata.status();
    transfer::EngineOptions engine_options;
    engine_options.name = fmt::format("serve-{}-{:x}", name, make_incarnation());
    engine_options.metadata = *metadata;
    engine_options.tcp.listen_host = resolved.advertise_host;
    engine_options.secret = options.secret;  // only members write KV into this instance's segment
    auto created = transfer::TransferEngine::create(engine_options);
    if (!created.ok()) return created.status();
    engine = std::move(*created);
  }
  std::unique_ptr<model::LlamaForward> model;
  if (config.serve.executor == cluster::ExecutorKind::kCpu) {
    auto loaded = model::load_llama_model(config.serve.model_dir);
    if (!loaded.ok()) return loaded.status();
    if (loaded->identity != options.cluster.block_key_seed) {
      return Status::invalid_argument(
          fmt::format("the model in {} is not the Conductor's: its identity is {:016x}, the cluster's block "
                      "keys are seeded "
                      "with {:016x}",
                      config.serve.model_dir, loaded->identity, options.cluster.block_key_seed));
    }
    model = std::make_unique<model::LlamaForward>(*loaded);
    // As many compute threads as cores this process may run on (one when pinned: --cpu, taskset).
    cpu_set_t set;
    if (::sched_getaffinity(0, sizeof(set), &set) == 0) model::set_compute_threads(CPU_COUNT(&set));
  }
  auto impl = std::make_unique<Impl>(resolved, std::move(client), std::move(engine), std::move(model));
  CRESCENT_RETURN_IF_ERROR(impl->init());
  // Found in etcd: whichever Conductor leads later is followed too (docs/serving.md, "Conductor failover").
  if (etcd && options.conductor_endpoint.empty()) {
    impl->follow_conductor(*etcd, etcd_conductor_key(options.etcd_prefix));
  }
  std::unique_ptr<LeasedKey> registration;
  if (etcd) {
    auto registered = LeasedKey::start(*etcd, etcd_instance_key(options.etcd_prefix, name),
                                       std::to_string(::getpid()), std::chrono::seconds(2));
    if (!registered.ok()) return registered.status();
    registration = std::move(*registered);
  }
  return std::unique_ptr<InstanceServer>(new InstanceServer(std::move(impl), std::move(registration)));
}

void InstanceServer::begin_drain() {
  impl_->begin_drain();
}
bool InstanceServer::drained() const {
  return impl_->drained();
}

InstanceServer::InstanceServer(std::unique_ptr<Impl> impl, std::unique_ptr<LeasedKey> registration)
    : impl_(std::move(impl)), registration_(std::move(registration)) {}
InstanceServer::~InstanceServer() = default;

}  // namespace crescent::serve
