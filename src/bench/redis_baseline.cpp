#include "bench/redis_baseline.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/socket_io.h"

namespace crescent::bench {
namespace {

using Clock = std::chrono::steady_clock;
using RedisContextPtr = std::unique_ptr<redisContext, decltype(&redisFree)>;
using ReplyPtr = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

RedisContextPtr connect(uint16_t port, timeval timeout) {
  return RedisContextPtr(redisConnectWithTimeout("127.0.0.1", port, timeout), &redisFree);
}

// Whether the server on `port` answers and is process `pid` (not another one that took the port).
bool answers_as(uint16_t port, pid_t pid) {
  RedisContextPtr c = connect(port, {0, 200'000});
  if (!c || c->err) return false;
  ReplyPtr reply(static_cast<redisReply*>(redisCommand(c.get(), "INFO server")), &freeReplyObject);
  return reply && reply->type == REDIS_REPLY_STRING &&
         std::string_view(reply->str, reply->len).find(fmt::format("process_id:{}\r", pid)) !=
             std::string::npos;
}

}  // namespace

Result<std::unique_ptr<RedisServer>> RedisServer::start() {
  if (::access(kBinary, X_OK) != 0) {
    return Status::not_found(
        fmt::format("{} not found: install the redis-server package (scripts/install-deps.sh)", kBinary));
  }
  Result<TempDir> dir = TempDir::create("crescent-redis");  // the server's --dir and log
  if (!dir.ok()) return dir.status();
  const std::string log = dir->file("redis.log");
  std::string why;
  for (int attempt = 0; attempt < 5; ++attempt) {  // another process may take the port before redis does
    const uint16_t port = net::free_tcp_port();
    const std::string port_text = std::to_string(port);
    auto process =
        ChildProcess::start({kBinary, "--port", port_text, "--bind", "127.0.0.1", "--protected-mode", "no",
                             "--save", "", "--appendonly", "no", "--dir", dir->path(), "--daemonize", "no"},
                            log);
    if (!process.ok()) return process.status();
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
    for (;;) {
      if (!(*process)->running()) {
        why =
            fmt::format("{} exited before answering; its log ends:\n{}", kBinary, (*process)->log_tail(600));
        break;
      }
      if (answers_as(port, (*process)->pid())) {
        return std::unique_ptr<RedisServer>(new RedisServer(std::move(*process), port, std::move(*dir)));
      }
      if (Clock::now() > deadline) {
        const std::string tail = (*process)->log_tail(600);
        process->reset();
        return Status::unavailable(fmt::format(
            "{} did not answer on 127.0.0.1:{} within 5 s; its log ends:\n{}", kBinary, port, tail));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (why.find("Address already in use") == std::string::npos) break;
  }
  return Status::unavailable(why);
}

RedisServer::~RedisServer() {
  process_.reset();  // SIGTERM, SIGKILL after 2 s, reaped; then dir_ goes
}

namespace {

// One worker's connection, keys and value buffer.
class RedisWorker {
 public:
  RedisWorker(RedisContextPtr c, const KvRunSpec& spec, int thread_index)
      : c_(std::move(c)), put_(spec.op == "put"), batch_(spec.batch), thread_index_(thread_index) {
    const uint64_t keys = std::clamp<uint64_t>((uint64_t{256} << 20) / spec.value_bytes, 1, 64);
    for (uint64_t k = 0; k < keys; ++k) keys_.push_back(fmt::format("crescent:t{}:k{}", thread_index, k));
    value_.resize(spec.value_bytes);
    for (size_t i = 0; i < value_.size(); ++i) value_[i] = static_cast<char>('a' + (i + thread_index) % 26);
  }

  // Pipelines `count` SETs (put) or GETs over the next keys, then reads and checks every reply.
  Status pipeline(bool put, size_t count) {
    const size_t first = next_;
    next_ = (next_ + count) % keys_.size();
    for (size_t j = 0; j < count; ++j) {
      const std::string& key = key_at(first + j);
      if (put) stamp(first + j);  // redisAppendCommand copies the value, so the next stamp is safe
      const int rc = put ? redisAppendCommand(c_.get(), "SET %b %b", key.data(), key.size(), value_.data(),
                                              value_.size())
                         : redisAppendCommand(c_.get(), "GET %b", key.data(), key.size());
      if (rc != REDIS_OK)
        return Status::unavailable(fmt::format("redis: queueing for {}: {}", key, c_->errstr));
    }
    for (size_t j = 0; j < count; ++j) {
      const std::string& key = key_at(first + j);
      void* raw = nullptr;
      if (redisGetReply(c_.get(), &raw) != REDIS_OK) {
        return Status::unavailable(fmt::format("redis: reply for {}: {}", key, c_->errstr));
      }
      ReplyPtr r(static_cast<redisReply*>(raw), &freeReplyObject);
      const std::string_view text = r->str ? std::string_view(r->str, r->len) : std::string_view();
      if (r->type == REDIS_REPLY_ERROR) return Status::unavailable(fmt::format("redis {}: {}", key, text));
      if (put && (r->type != REDIS_REPLY_STATUS || text != "OK")) {
        return Status::internal(
            fmt::format("redis SET {}: reply type {} '{}', expected OK", key, r->type, text));
      }
      if (put) continue;
      if (r->type != REDIS_REPLY_STRING || r->len != value_.size()) {
        return Status::internal(
            fmt::format("redis GET {}: reply type {} of {} bytes, expected a string of {}", key, r->type,
                        r->len, value_.size()));
      }
      stamp(first + j);
      if (std::memcmp(r->str, value_.data(), std::min<size_t>(16, value_.size())) != 0) {
        return Status::internal(fmt::format("redis GET {}: first bytes differ from the value stored", key));
      }
    }
    return Status();
  }

  Status operator()() { return pipeline(put_, batch_); }
  size_t key_count() const { return keys_.size(); }

 private:
  const std::string& key_at(size_t n) const { return keys_[n % keys_.size()]; }
  // Writes key n's tag (thread, key number) into the value's first bytes: each key has known, distinct
  // content.
  void stamp(size_t n) {
    const uint64_t tag = (uint64_t(thread_index_) << 32) | (n % keys_.size());
    std::memcpy(value_.data(), &tag, std::min<size_t>(sizeof tag, value_.size()));
  }

  RedisContextPtr c_;
  bool put_;
  size_t batch_;
  int thread_index_;
  std::vector<std::string> keys_;
  std::string value_;
  size_t next_ = 0;
};

}  // namespace

Result<KvWorker> make_redis_worker(uint16_t port, const KvRunSpec& spec, int thread_index) {
  if (spec.op != "put" && spec.op != "get") {
    return Status::invalid_argument(fmt::format("op '{}': expected put or get", spec.op));
  }
  if (spec.batch < 1 || spec.value_bytes == 0) {
    return Status::invalid_argument(
        fmt::format("batch {}, value_bytes {}: each must be positive", spec.batch, spec.value_bytes));
  }
  RedisContextPtr c = connect(port, {2, 0});
  if (!c) return Status::unavailable(fmt::format("redis 127.0.0.1:{}: cannot allocate a connection", port));
  if (c->err) return Status::unavailable(fmt::format("redis 127.0.0.1:{}: {}", port, c->errstr));
  redisSetTimeout(c.get(), {10, 0});  // a hung server fails the call instead of the whole bench
  auto worker = std::make_shared<RedisWorker>(std::move(c), spec, thread_index);
  if (spec.op == "get") {
    Status preload = worker->pipeline(/*put=*/true, worker->key_count());
    if (!preload.ok()) return Status::unavailable(fmt::format("preloading keys: {}", preload.message()));
  }
  return KvWorker([worker] { return (*worker)(); });
}

}  // namespace crescent::bench
