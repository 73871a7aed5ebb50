#include "serve/kv_events.h"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <limits>
#include <msgpack.hpp>
#include <mutex>
#include <optional>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/socket_io.h"
#include "conductor/cluster_state.h"
#include "serve/members_only.h"

namespace crescent::serve {
namespace {

constexpr int64_t kEndSeq = -1;
// How long a subscriber waits for a replay's end marker before reporting what did not come as a gap.
constexpr std::chrono::milliseconds kReplayTimeout{2000};
// catch_up's: it is retried, and must not hold a caller serving other publishers for long.
constexpr std::chrono::milliseconds kCatchUpTimeout{250};

std::string seq_bytes(int64_t seq) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(seq) >> (56 - 8 * i));
  return out;
}

std::optional<int64_t> read_seq(const zmq::message_t& frame) {
  if (frame.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<const unsigned char*>(frame.data())[i];
  return static_cast<int64_t>(v);
}

template <typename Packer>
void pack_hashes(Packer& pk, const std::vector<BlockKey>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (BlockKey h : hashes) pk.pack_uint64(h);
}

template <typename Packer, typename T>
void pack_optional(Packer& pk, const std::optional<T>& v) {
  if (v) {
    pk.pack(*v);
  } else {
    pk.pack_nil();
  }
}

Status bad(std::string what) {
  return Status::invalid_argument("KV event batch: " + std::move(what));
}

Result<BlockKey> read_hash(const msgpack::object& o, std::string_view where) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) return static_cast<BlockKey>(o.via.u64);
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return static_cast<BlockKey>(o.via.i64);
  if (o.type == msgpack::type::BIN && o.via.bin.size >= 8) {
    BlockKey v = 0;
    for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(o.via.bin.ptr[i]);
    return v;
  }
  return bad(fmt::format("{}: a block hash must be an integer or 8+ bytes", where));
}

Result<std::vector<BlockKey>> read_hashes(const msgpack::object& o, std::string_view where) {
  if (o.type != msgpack::type::ARRAY) return bad(fmt::format("{}: block_hashes must be an array", where));
  std::vector<BlockKey> out;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    auto h = read_hash(o.via.array.ptr[i], where);
    if (!h.ok()) return h.status();
    out.push_back(*h);
  }
  return out;
}

Result<std::optional<std::string>> read_medium(const msgpack::object& o, std::string_view where) {
  if (o.type == msgpack::type::NIL) return std::optional<std::string>();
  if (o.type != msgpack::type::STR) return bad(fmt::format("{}: medium must be a string or nil", where));
  return std::optional<std::string>(std::string(o.via.str.ptr, o.via.str.size));
}

Result<KvEvent> read_event(const msgpack::object& o, size_t index) {
  const std::string where = fmt::format("event {}", index);
  if (o.type != msgpack::type::ARRAY || o.via.array.size < 1 ||
      o.via.array.ptr[0].type != msgpack::type::STR) {
    return bad(where + ": not a tagged array [\"Tag\", ...]");
  }
  const msgpack::object* f = o.via.array.ptr;
  const uint32_t n = o.via.array.size;
  const std::string_view tag(f[0].via.str.ptr, f[0].via.str.size);
  KvEvent e;
  if (tag == "BlockStored") {
    if (n < 5)
      return bad(where + ": BlockStored needs block_hashes, parent_block_hash, token_ids, block_size");
    e.kind = KvEvent::Kind::kStored;
    auto hashes = read_hashes(f[1], where);
    if (!hashes.ok()) return hashes.status();
    e.block_hashes = std::move(*hashes);
    if (f[2].type != msgpack::type::NIL) {
      auto parent = read_hash(f[2], where);
      if (!parent.ok()) return parent.status();
      e.parent_block_hash = *parent;
    }
    if (f[3].type != msgpack::type::ARRAY) return bad(where + ": token_ids must be an array");
    for (uint32_t i = 0; i < f[3].via.array.size; ++i) {
      const msgpack::object& t = f[3].via.array.ptr[i];
      if (t.type != msgpack::type::POSITIVE_INTEGER)
        return bad(where + ": token_ids must be non-negative integers");
      e.token_ids.push_back(static_cast<int64_t>(t.via.u64));
    }
    if (f[4].type != msgpack::type::POSITIVE_INTEGER)
      return bad(where + ": block_size must be a positive integer");
    e.block_size = static_cast<int64_t>(f[4].via.u64);
    if (n >= 7) {
      auto medium = read_medium(f[6], where);
      if (!medium.ok()) return medium.status();
      e.medium = std::move(*medium);
    }
  } else if (tag == "BlockRemoved") {
    if (n < 2) return bad(where + ": BlockRemoved needs block_hashes");
    e.kind = KvEvent::Kind::kRemoved;
    auto hashes = read_hashes(f[1], where);
    if (!hashes.ok()) return hashes.status();
    e.block_hashes = std::move(*hashes);
    if (n >= 3) {
      auto medium = read_medium(f[2], where);
      if (!medium.ok()) return medium.status();
      e.medium = std::move(*medium);
    }
  } else if (tag == "AllBlocksCleared") {
    e.kind = KvEvent::Kind::kAllCleared;
  } else {
    return bad(fmt::format("{}: unknown event tag '{}'", where, tag));
  }
  return e;
}

}  // namespace

std::string encode_kv_event_batch(const KvEventBatch& batch) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_array(3);
  pk.pack_double(batch.timestamp_s);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) {
    switch (e.kind) {
      case KvEvent::Kind::kStored:
        pk.pack_array(7);
        pk.pack(std::string_view("BlockStored"));
        pack_hashes(pk, e.block_hashes);
        pack_optional(pk, e.parent_block_hash);
        pk.pack(e.token_ids);
        pk.pack(e.block_size);
        pk.pack_nil();  // lora_id
        pack_optional(pk, e.medium);
        break;
      case KvEvent::Kind::kRemoved:
        pk.pack_array(3);
        pk.pack(std::string_view("BlockRemoved"));
        pack_hashes(pk, e.block_hashes);
        pack_optional(pk, e.medium);
        break;
      case KvEvent::Kind::kAllCleared:
        pk.pack_array(1);
        pk.pack(std::string_view("AllBlocksCleared"));
        break;
    }
  }
  pack_optional(pk, batch.data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

Result<KvEventBatch> decode_kv_event_batch(std::string_view payload) {
  msgpack::object_handle handle;
  size_t used = 0;
  try {
    handle = msgpack::unpack(payload.data(), payload.size(), used);
  } catch (const std::exception& e) {
    return bad(fmt::format("not msgpack ({})", e.what()));
  }
  if (used != payload.size()) return bad(fmt::format("{} bytes after the batch", payload.size() - used));
  const msgpack::object& o = handle.get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size < 2) {
    return bad("expected an array [timestamp, events, data_parallel_rank]");
  }
  const msgpack::object* f = o.via.array.ptr;
  KvEventBatch batch;
  if (f[0].type == msgpack::type::FLOAT64 || f[0].type == msgpack::type::FLOAT32) {
    batch.timestamp_s = f[0].via.f64;
  } else if (f[0].type == msgpack::type::POSITIVE_INTEGER) {
    batch.timestamp_s = static_cast<double>(f[0].via.u64);
  } else {
    return bad("the timestamp must be a number");
  }
  if (f[1].type != msgpack::type::ARRAY) return bad("events must be an array");
  for (uint32_t i = 0; i < f[1].via.array.size; ++i) {
    auto event = read_event(f[1].via.array.ptr[i], i);
    if (!event.ok()) return event.status();
    batch.events.push_back(std::move(*event));
  }
  if (o.via.array.size >= 3 && f[2].type != msgpack::type::NIL) {
    if (f[2].type != msgpack::type::POSITIVE_INTEGER)
      return bad("data_parallel_rank must be an integer or nil");
    batch.data_parallel_rank = static_cast<int64_t>(f[2].via.u64);
  }
  return batch;
}

void apply_kv_events(const KvEventBatch& batch, InstanceId instance, conductor::ClusterState& state,
                     double now_s) {
  for (const KvEvent& e : batch.events) {
    switch (e.kind) {
      case KvEvent::Kind::kStored:
        state.on_kv_event(instance, e.block_hashes, {}, now_s);
        break;
      case KvEvent::Kind::kRemoved:
        state.on_kv_event(instance, {}, e.block_hashes, now_s);
        break;
      case KvEvent::Kind::kAllCleared:
        state.on_kv_cleared(instance);
        break;
    }
  }
}

// ---- Publisher -----------------------------------------------------------------------------------------

class KvEventPublisher::Impl {
 public:
  Impl(std::string topic, size_t buffer_batches) : topic_(std::move(topic)), capacity_(buffer_batches) {}

  ~Impl() {
    stopping_ = true;
    if (replay_thread_.joinable()) replay_thread_.join();
  }

  Status start(const std::string& endpoint, const std::string& replay_endpoint, const ClusterSecret* secret) {
    if (secret != nullptr) {
      auto zap = MembersOnly::start(context_, *secret);
      if (!zap.ok()) return zap.status();
      zap_ = std::move(*zap);
      make_member_server(pub_, *secret);
      make_member_server(router_, *secret);
    }
    try {
      pub_.set(zmq::sockopt::linger, 0);
      pub_.set(zmq::sockopt::sndhwm, 100'000);
      pub_.bind(net::zmq_bindable(endpoint));
      endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return Status::unavailable(fmt::format("KV events: bind {}: {}", endpoint, e.what()));
    }
    try {
      router_.set(zmq::sockopt::linger, 0);
      router_.bind(net::zmq_bindable(replay_endpoint));
      replay_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return Status::unavailable(fmt::format("KV events: bind replay {}: {}", replay_endpoint, e.what()));
    }
    replay_thread_ = std::thread([this] { serve_replay(); });
    return Status();
  }

  uint64_t publish(const KvEventBatch& batch) {
    std::string payload = encode_kv_event_batch(batch);
    std::lock_guard lock(mu_);
    const uint64_t seq = next_seq_++;
    const std::string seq_frame = seq_bytes(static_cast<int64_t>(seq));
    pub_.send(zmq::buffer(topic_), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(payload), zmq::send_flags::none);
    buffer_.emplace_back(seq, std::move(payload));
    if (buffer_.size() > capacity_) buffer_.pop_front();
    return seq;
  }

  std::string endpoint_, replay_endpoint_;

 private:
  // Answers ["", start seq] with every buffered batch from there, then the end marker.
  void serve_replay() {
    while (!stopping_) {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(router_, std::back_inserter(frames))) continue;
      // [client id, "", start] from a DEALER that sends the empty delimiter; [client id, start] without it.
      if (frames.size() < 2) continue;
      const auto start = read_seq(frames.back());
      if (!start) continue;
      std::vector<std::pair<uint64_t, std::string>> batches;
      {
        std::lock_guard lock(mu_);
        for (const auto& [seq, payload] : buffer_) {
          if (static_cast<int64_t>(seq) >= *start) batches.emplace_back(seq, payload);
        }
      }
      const std::string client(static_cast<const char*>(frames[0].data()), frames[0].size());
      for (const auto& [seq, payload] : batches) {
        router_.send(zmq::buffer(client), zmq::send_flags::sndmore);
        router_.send(zmq::message_t(), zmq::send_flags::sndmore);
        router_.send(zmq::buffer(seq_bytes(static_cast<int64_t>(seq))), zmq::send_flags::sndmore);
        router_.send(zmq::buffer(payload), zmq::send_flags::none);
      }
      router_.send(zmq::buffer(client), zmq::send_flags::sndmore);
      router_.send(zmq::message_t(), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(seq_bytes(kEndSeq)), zmq::send_flags::sndmore);
      router_.send(zmq::message_t(), zmq::send_flags::none);
    }
  }

  const std::string topic_;
  const size_t capacity_;
  zmq::context_t context_{1};
  std::unique_ptr<MembersOnly> zap_;  // with a secret: admits members only (closed after the sockets below)
  zmq::socket_t pub_{context_, zmq::socket_type::pub};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  std::mutex mu_;  // pub_, buffer_, next_seq_
  std::deque<std::pair<uint64_t, std::string>> buffer_;
  uint64_t next_seq_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread replay_thread_;
};

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::start(const std::string& endpoint,
                                                                  const std::string& replay_endpoint,
                                                                  std::string topic, size_t buffer_batches,
                                                                  const ClusterSecret* secret) {
  auto impl = std::make_unique<Impl>(std::move(topic), std::max<size_t>(1, buffer_batches));
  CRESCENT_RETURN_IF_ERROR(impl->start(endpoint, replay_endpoint, secret));
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}
KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvEventPublisher::~KvEventPublisher() = default;
const std::string& KvEventPublisher::endpoint() const {
  return impl_->endpoint_;
}
const std::string& KvEventPublisher::replay_endpoint() const {
  return impl_->replay_endpoint_;
}
uint64_t KvEventPublisher::publish(const KvEventBatch& batch) {
  return impl_->publish(batch);
}

// ---- Subscriber ----------------------------------------------------------------------------------------

class KvEventSubscriber::Impl {
 public:
  Status connect(const std::string& endpoint, const std::string& replay_endpoint, const std::string& topic,
                 const ClusterSecret* secret) {
    if (secret != nullptr) secret_ = *secret;
    try {
      if (secret_) make_member_client(sub_, *secret_);
      sub_.set(zmq::sockopt::linger, 0);
      sub_.set(zmq::sockopt::subscribe, topic);
      sub_.connect(endpoint);
      replay_endpoint_ = replay_endpoint;
      if (!replay_endpoint_.empty()) open_dealer();
    } catch (const zmq::error_t& e) {
      return Status::invalid_argument(
          fmt::format("KV events: connect {} / {}: {}", endpoint, replay_endpoint, e.what()));
    }
    return Status();
  }

  void poll(std::chrono::milliseconds timeout,
            const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
            const std::function<void(uint64_t, uint64_t)>& on_gap) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::max(left, std::chrono::milliseconds(0)));
      if (!(item.revents & ZMQ_POLLIN)) return;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(sub_, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
      const auto seq = frames.size() == 3 ? read_seq(frames[1]) : std::nullopt;
      if (!seq || *seq < 0) {
        ++malformed_;
        continue;
      }
      const auto s = static_cast<uint64_t>(*seq);
      if (s < expected_) {
        // The PUB socket never repeats a number (a replay delivers only below the one that asked for it):
        // a lower one means the publisher restarted and numbers from 0 again, its cache new.
        on_gap(expected_, s);
        expected_ = 0;
      }
      if (s > expected_) fill_gap(s, on_batch, on_gap);
      if (s < expected_) continue;
      deliver(s, frames[2], on_batch);
    }
  }

  void catch_up(const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
                const std::function<void(uint64_t, uint64_t)>& on_gap) {
    fill_gap(std::nullopt, on_batch, on_gap, kCatchUpTimeout);
  }

  uint64_t malformed() const { return malformed_; }
  uint64_t replayed() const { return replayed_; }

 private:
  // A fresh DEALER on the replay socket: a new identity, so replies still on their way to the old one are
  // dropped by the publisher's ROUTER instead of being read as answers to the next request.
  void open_dealer() {
    dealer_ = zmq::socket_t(context_, zmq::socket_type::dealer);
    if (secret_) make_member_client(dealer_, *secret_);
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.connect(replay_endpoint_);
  }

  void deliver(uint64_t seq, const zmq::message_t& payload,
               const std::function<void(uint64_t, const KvEventBatch&)>& on_batch) {
    expected_ = seq + 1;
    auto batch =
        decode_kv_event_batch(std::string_view(static_cast<const char*>(payload.data()), payload.size()));
    if (!batch.ok()) {
      ++malformed_;
      return;
    }
    on_batch(seq, *batch);
  }

  // Asks the replay socket for [expected_, upto) (nullopt: every batch it holds from expected_ on) and
  // delivers what comes back in order.
  void fill_gap(std::optional<uint64_t> upto,
                const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
                const std::function<void(uint64_t, uint64_t)>& on_gap,
                std::chrono::milliseconds timeout = kReplayTimeout) {
    if (replay_endpoint_.empty()) {  // nothing to ask: the batches in between are lost
      if (upto) {
        on_gap(expected_, *upto);
        expected_ = *upto;
      }
      return;
    }
    const uint64_t end = upto.value_or(std::numeric_limits<uint64_t>::max());
    dealer_.send(zmq::message_t(), zmq::send_flags::sndmore);
    dealer_.send(zmq::buffer(seq_bytes(static_cast<int64_t>(expected_))), zmq::send_flags::none);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool answered = false;  // the end marker came
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds(0)) break;
      zmq::pollitem_t item{dealer_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, left);
      if (!(item.revents & ZMQ_POLLIN)) break;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(dealer_, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
      if (frames.size() != 3) {
        ++malformed_;
        continue;
      }
      const auto seq = read_seq(frames[1]);
      if (!seq) {
        ++malformed_;
        continue;
      }
      if (*seq == kEndSeq) {
        answered = true;
        break;
      }
      const auto s = static_cast<uint64_t>(*seq);
      if (s < expected_ || s >= end) continue;
      if (s > expected_) {  // the publisher's buffer no longer reaches back to expected_
        on_gap(expected_, s);
        expected_ = s;
      }
      ++replayed_;
      deliver(s, frames[2], on_batch);
    }
    if (!answered) open_dealer();  // late replies to this request must not answer the next one
    if (upto && expected_ < *upto) {
      on_gap(expected_, *upto);
      expected_ = *upto;
    }
  }

  zmq::context_t context_{1};
  zmq::socket_t sub_{context_, zmq::socket_type::sub};
  zmq::socket_t dealer_;
  std::optional<ClusterSecret> secret_;  // a members-only publisher's
  std::string replay_endpoint_;
  uint64_t expected_ = 0;
  uint64_t malformed_ = 0;
  uint64_t replayed_ = 0;
};

Result<std::unique_ptr<KvEventSubscriber>> KvEventSubscriber::connect(const std::string& endpoint,
                                                                      const std::string& replay_endpoint,
                                                                      std::string topic,
                                                                      const ClusterSecret* secret) {
  auto impl = std::make_unique<Impl>();
  CRESCENT_RETURN_IF_ERROR(impl->connect(endpoint, replay_endpoint, topic, secret));
  return std::unique_ptr<KvEventSubscriber>(new KvEventSubscriber(std::move(impl)));
}
KvEventSubscriber::KvEventSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvEventSubscriber::~KvEventSubscriber() = default;
void KvEventSubscriber::poll(std::chrono::milliseconds timeout,
                             const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
                             const std::function<void(uint64_t, uint64_t)>& on_gap) {
  impl_->poll(timeout, on_batch, on_gap);
}
void KvEventSubscriber::catch_up(const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
                                 const std::function<void(uint64_t, uint64_t)>& on_gap) {
  impl_->catch_up(on_batch, on_gap);
}
uint64_t KvEventSubscriber::malformed() const {
  return impl_->malformed();
}
uint64_t KvEventSubscriber::replayed() const {
  return impl_->replayed();
}

}  // namespace crescent::serve
