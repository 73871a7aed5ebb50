#include "model/profiler.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <Eigen/Dense>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine_core.h"
#include "model/cpu_executor.h"
#include "model/cpu_limits.h"
#include "perf/cost_model.h"

namespace crescent::model {
namespace {

class MockTarget final : public ProfileTarget {
 public:
  explicit MockTarget(const perf::CostModel& cost) : executor_(cost) {}
  Result<double> prefill_s(int64_t new_tokens, int64_t prefix_tokens) override {
    return mixed_s(0, 0, new_tokens, prefix_tokens);
  }
  Result<double> decode_s(int64_t batch, int64_t context_tokens) override {
    return mixed_s(batch, context_tokens, 0, 0);
  }
  Result<double> mixed_s(int64_t batch, int64_t context_tokens, int64_t new_tokens,
                         int64_t prefix_tokens) override {
    engine::IterationPlan plan;
    plan.decode_requests = batch;
    plan.decode_context_tokens = batch * context_tokens;
    if (new_tokens > 0) plan.prefill_request = 1;
    plan.prefill_tokens = new_tokens;
    plan.prefill_prefix_tokens = prefix_tokens;
    return executor_.run_iteration_s(plan);
  }

 private:
  engine::MockExecutor executor_;
};

// Requests made up for each timing: decoding ones hold zeroed KV (add_decoding), a prefill's cached prefix
// is zeroed blocks imported under fresh keys; all are dropped after the iteration.
class CpuTarget final : public ProfileTarget {
 public:
  CpuTarget(LlamaForward& model, int64_t block_size_tokens, int64_t capacity_blocks)
      : model_(model),
        block_(block_size_tokens),
        executor_(model, {.block_size_tokens = block_size_tokens, .capacity_blocks = capacity_blocks}),
        zeros_(static_cast<size_t>(executor_.layout().block_bytes())) {}

  Result<double> prefill_s(int64_t new_tokens, int64_t prefix_tokens) override {
    return mixed_s(0, 0, new_tokens, prefix_tokens);
  }
  Result<double> decode_s(int64_t batch, int64_t context_tokens) override {
    return mixed_s(batch, context_tokens, 0, 0);
  }
  Result<double> mixed_s(int64_t batch, int64_t context_tokens, int64_t new_tokens,
                         int64_t prefix_tokens) override {
    std::vector<engine::RequestId> ids;
    engine::RequestId prefill_id = 0;
    // Whatever was added is dropped on every way out.
    const auto drop_all = [&] {
      for (engine::RequestId id : ids) executor_.drop(id);
      if (prefill_id != 0) executor_.drop(prefill_id);
    };
    engine::IterationPlan plan;
    for (int64_t i = 0; i < batch; ++i) {
      const engine::RequestId id = next_id_++;
      const int64_t blocks = (context_tokens + block_ - 1) / block_;
      kv_.assign(static_cast<size_t>(blocks) * zeros_.size(), std::byte{0});
      const Status added = executor_.add_decoding(
          id, {.prompt_tokens = context_tokens, .first_token = 1, .output_tokens = 2}, kv_);
      if (!added.ok()) {
        drop_all();
        return added;
      }
      ids.push_back(id);
    }
    plan.decode_requests = batch;
    plan.decode_context_tokens = batch * context_tokens;
    plan.decode_ids = ids;
    if (new_tokens > 0) {
      const engine::RequestId id = next_id_++;
      std::vector<BlockKey> keys;
      const int64_t total = prefix_tokens + new_tokens;
      while (std::ssize(keys) < total / block_) keys.push_back(next_key_++);
      std::vector<int32_t> prompt(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i)
        prompt[static_cast<size_t>(i)] = static_cast<int32_t>(i % model_.config().vocab_size);
      const Status added =
          executor_.add_request(id, {.prompt = std::move(prompt), .block_keys = std::move(keys)});
      if (!added.ok()) {
        drop_all();
        return added;
      }
      prefill_id = id;
      // The cached prefix, as a prefix read from the pool is given.
      for (int64_t b = 0; b < prefix_tokens / block_; ++b) {
        if (Status s = executor_.import_block(prefill_id, b, zeros_); !s.ok()) {
          drop_all();
          return s;
        }
      }
      plan.prefill_request = prefill_id;
      plan.prefill_tokens = new_tokens;
      plan.prefill_prefix_tokens = prefix_tokens;
    }
    const double seconds = executor_.run_iteration_s(plan);
    const std::string error = prefill_id != 0 ? executor_.error(prefill_id) : std::string();
    drop_all();
    if (!error.empty()) return Status::internal(fmt::format("profile: the prefill failed: {}", error));
    return seconds;
  }

 private:
  LlamaForward& model_;
  const int64_t block_;
  CpuExecutor executor_;
  const std::vector<std::byte> zeros_;
  std::vector<std::byte> kv_;
  engine::RequestId next_id_ = 1;
  BlockKey next_key_ = 1;
};

class CpuNeighbour final : public ProfileNeighbour {
 public:
  CpuNeighbour(const LlamaModel& model, int64_t block_size_tokens, int64_t prefill_tokens,
               int64_t decode_context_tokens)
      : forward_(model),
        target_(forward_, block_size_tokens,
                2 * (prefill_tokens + decode_context_tokens) / block_size_tokens + 16),
        prefill_tokens_(prefill_tokens),
        decode_context_tokens_(decode_context_tokens) {}

  ~CpuNeighbour() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Starts the thread on `core`; an error when it cannot run there.
  Status start(int core) {
    std::promise<Status> pinned;
    std::future<Status> pinned_result = pinned.get_future();
    thread_ = std::thread([this, core, &pinned] {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (core >= 0 && core < CPU_SETSIZE) CPU_SET(core, &set);
      if (CPU_COUNT(&set) == 0 || pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
        pinned.set_value(Status::invalid_argument(
            fmt::format("--neighbour-core {}: this process cannot run a thread on that core", core)));
        return;
      }
      set_compute_threads(1);
      pinned.set_value(Status::ok_status());
      loop();
    });
    Status status = pinned_result.get();
    if (!status.ok()) thread_.join();
    return status;
  }

  void set_work(NeighbourWork work) override {
    std::unique_lock lock(mu_);
    work_ = work;
    const uint64_t asked = ++asked_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return begun_ >= asked; });
  }

  int64_t iterations() const override { return iterations_.load(std::memory_order_relaxed); }

  Status status() const override {
    std::lock_guard lock(mu_);
    return status_;
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || work_ != NeighbourWork::kIdle || begun_ < asked_; });
      if (stopping_) return;
      const NeighbourWork work = work_;
      begun_ = asked_;
      cv_.notify_all();
      if (work == NeighbourWork::kIdle) continue;
      lock.unlock();
      const Result<double> ran = work == NeighbourWork::kPrefill
                                     ? target_.prefill_s(prefill_tokens_, 0)
                                     : target_.decode_s(1, decode_context_tokens_);
      lock.lock();
      if (!ran.ok()) {  // idle until asked again; profile_target reports it
        if (status_.ok()) status_ = ran.status();
        if (begun_ == asked_) work_ = NeighbourWork::kIdle;
        continue;
      }
      iterations_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  LlamaForward forward_;
  CpuTarget target_;
  const int64_t prefill_tokens_, decode_context_tokens_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  NeighbourWork work_ = NeighbourWork::kIdle;  // guarded by mu_
  Status status_;                              // guarded by mu_: the first failed iteration's
  uint64_t asked_ = 0, begun_ = 0;             // guarded by mu_: set_work calls, and those taken up
  bool stopping_ = false;                      // guarded by mu_
  std::atomic<int64_t> iterations_{0};
  std::thread thread_;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of `repeats` timings by `run`, or the first that failed.
template <typename F>
Result<double> timed(int repeats, F&& run) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    Result<double> t = run();
    if (!t.ok()) return t.status();
    times.push_back(*t);
  }
  return median_of(std::move(times));
}

// Weighted least squares: the x minimizing sum(((A x - y) / y)²), each row scaled by 1 / y (every point
// counts by its relative error, so short iterations weigh as much as long ones).
Eigen::VectorXd fit_relative(const std::vector<std::vector<double>>& rows, const std::vector<double>& y) {
  Eigen::MatrixXd a(static_cast<Eigen::Index>(rows.size()), static_cast<Eigen::Index>(rows.front().size()));
  Eigen::VectorXd b(static_cast<Eigen::Index>(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) {
      a(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = rows[i][j] / y[i];
    }
    b(static_cast<Eigen::Index>(i)) = 1.0;
  }
  return a.colPivHouseholderQr().solve(b);
}

// fit_relative over the points of `kind` (`row` gives a point's regressors) that `unexplained` keeps, or over
// all of them when fewer than 3 are kept.
template <typename Row, typename Keep>
Eigen::VectorXd fit_kind(const std::vector<ProfilePoint>& points, const std::string& kind, Row row,
                         Keep unexplained) {
  std::vector<std::vector<double>> rows, all_rows;
  std::vector<double> y, all_y;
  for (const ProfilePoint& p : points) {
    if (p.kind != kind) continue;
    if (unexplained(p)) {
      rows.push_back(row(p));
      y.push_back(p.measured_s);
    }
    all_rows.push_back(row(p));
    all_y.push_back(p.measured_s);
  }
  return rows.size() >= 3 ? fit_relative(rows, y) : fit_relative(all_rows, all_y);
}

double rms_relative(const std::vector<ProfilePoint>& points, const std::string& kind) {
  double sum = 0;
  int n = 0;
  for (const ProfilePoint& p : points) {
    if (p.kind != kind) continue;
    const double e = (p.fitted_s - p.measured_s) / p.measured_s;
    sum += e * e;
    ++n;
  }
  return n == 0 ? 0 : std::sqrt(sum / n);
}

Status check_grid(const ProfileGrid& g) {
  const auto positive = [](const std::vector<int64_t>& v) {
    return !v.empty() && std::ranges::all_of(v, [](int64_t x) { return x >= 1; });
  };
  if (!positive(g.prefill_tokens) || !positive(g.decode_batch) || !positive(g.decode_context) ||
      std::ranges::any_of(g.chunk_tokens, [](int64_t x) { return x < 1; }) || g.prefix_tokens.empty() ||
      std::ranges::any_of(g.prefix_tokens, [](int64_t x) { return x < 0; }) || g.chunked_prompt_tokens < 1 ||
      g.chunked_decode_batch < 0 || g.chunked_decode_context < 1 || g.repeats < 1) {
    return Status::invalid_argument(
        "profile grid: every size must be >= 1 (prefixes >= 0) and no list empty (but chunk sizes)");
  }
  if (g.prefill_tokens.size() * g.prefix_tokens.size() < 3 ||
      g.decode_batch.size() * g.decode_context.size() < 3) {
    return Status::invalid_argument("profile grid: at least 3 prefill and 3 decode points are needed to fit");
  }
  return Status::ok_status();
}

}  // namespace

std::unique_ptr<ProfileTarget> mock_profile_target(const perf::CostModel& cost) {
  return std::make_unique<MockTarget>(cost);
}

std::unique_ptr<ProfileTarget> cpu_profile_target(LlamaForward& model, int64_t block_size_tokens,
                                                  int64_t capacity_blocks) {
  return std::make_unique<CpuTarget>(model, block_size_tokens, capacity_blocks);
}

Result<std::unique_ptr<ProfileNeighbour>> cpu_profile_neighbour(const LlamaModel& model, int core,
                                                                int64_t block_size_tokens,
                                                                int64_t prefill_tokens,
                                                                int64_t decode_context_tokens) {
  if (block_size_tokens < 1 || prefill_tokens < 1 || decode_context_tokens < 1) {
    return Status::invalid_argument("profile neighbour: block size, prefill and context must be >= 1");
  }
  auto neighbour =
      std::make_unique<CpuNeighbour>(model, block_size_tokens, prefill_tokens, decode_context_tokens);
  CRESCENT_RETURN_IF_ERROR(neighbour->start(core));
  return std::unique_ptr<ProfileNeighbour>(std::move(neighbour));
}

Result<ProfileReport> profile_target(ProfileTarget& target, const ProfileGrid& grid,
                                     const std::string& source,
                                     const std::function<void(const std::string&)>& progress,
                                     ProfileNeighbour* neighbour) {
  CRESCENT_RETURN_IF_ERROR(check_grid(grid));
  const auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const auto beside = [&](NeighbourWork work) {
    if (neighbour != nullptr) neighbour->set_work(work);
  };
  // The neighbour's first failure, which makes what was timed beside it worthless.
  const auto neighbour_status = [&] { return neighbour != nullptr ? neighbour->status() : Status(); };
  // The neighbour goes idle on every way out.
  struct Idle {
    ProfileNeighbour* n;
    ~Idle() {
      if (n != nullptr) n->set_work(NeighbourWork::kIdle);
    }
  } idle_on_return{neighbour};
  ProfileReport report;
  perf::Profile& c = report.profile;
  c.source = source;

  // Measure: prefill (new, prefix) and decode (batch, context) points.
  say("profile: prefill iterations");
  beside(NeighbourWork::kDecode);
  for (int64_t n : grid.prefill_tokens) {
    for (int64_t p : grid.prefix_tokens) {
      const Result<double> t = timed(grid.repeats, [&] { return target.prefill_s(n, p); });
      if (!t.ok()) return t.status();
      report.points.push_back({.kind = "prefill", .a = n, .b = p, .measured_s = *t});
    }
  }
  CRESCENT_RETURN_IF_ERROR(neighbour_status());
  say("profile: decode steps");
  beside(NeighbourWork::kPrefill);
  for (int64_t b : grid.decode_batch) {
    for (int64_t ctx : grid.decode_context) {
      const Result<double> t = timed(grid.repeats, [&] { return target.decode_s(b, ctx); });
      if (!t.ok()) return t.status();
      report.points.push_back({.kind = "decode", .a = b, .b = ctx, .measured_s = *t});
    }
  }

  beside(NeighbourWork::kIdle);
  CRESCENT_RETURN_IF_ERROR(neighbour_status());

  // Fit. An iteration is max(memory, compute) (+ overhead when it prefills), so each side is fitted on the
  // points the other side does not explain (within 2%): compute on prefill points, memory on decode points,
  // twice, starting from every point (a side with fewer than 3 points left keeps all of its kind).
  // Prefill: t = overhead + n × linear + n × (p + (n + 1) / 2) × attention.
  // Decode:  t = weights + batch × per_request + batch × context × kv_read.
  bool fitted = false;
  for (int round = 0; round < 2; ++round) {
    const Eigen::VectorXd prefill = fit_kind(
        report.points, "prefill",
        [](const ProfilePoint& p) {
          const auto n = static_cast<double>(p.a);
          return std::vector<double>{1.0, n, n * (static_cast<double>(p.b) + (n + 1) / 2)};
        },
        [&](const ProfilePoint& p) {
          const double memory_s = c.prefill_iteration_overhead_s + c.decode_weight_read_s +
                                  static_cast<double>(p.b) * c.decode_kv_read_s_per_token;
          return !fitted || p.measured_s > 1.02 * memory_s;
        });
    c.prefill_iteration_overhead_s = std::max(0.0, prefill(0));
    c.linear_s_per_token = std::max(1e-12, prefill(1));
    c.attention_s_per_token_context = std::max(0.0, prefill(2));

    const Eigen::VectorXd decode = fit_kind(
        report.points, "decode",
        [](const ProfilePoint& p) {
          return std::vector<double>{1.0, static_cast<double>(p.a), static_cast<double>(p.a * p.b)};
        },
        [&](const ProfilePoint& p) {
          const double compute_s = static_cast<double>(p.a) * c.linear_s_per_token +
                                   static_cast<double>(p.a * p.b) * c.attention_s_per_token_context;
          return p.measured_s > 1.02 * compute_s;
        });
    c.decode_weight_read_s = std::max(0.0, decode(0));
    c.decode_s_per_request = std::max(0.0, decode(1));
    c.decode_kv_read_s_per_token = std::max(0.0, decode(2));
    fitted = true;
  }

  for (ProfilePoint& p : report.points) {
    p.fitted_s = p.kind == "prefill" ? perf::CostModel::iteration_time_s(c, 0, 0, p.a, p.b)
                                     : perf::CostModel::iteration_time_s(c, p.a, p.a * p.b, 0, 0);
  }
  report.prefill_rms_relative = rms_relative(report.points, "prefill");
  report.decode_rms_relative = rms_relative(report.points, "decode");

  // Chunked prefill beside a running decode batch, against the whole prompt in one iteration (none asked
  // for: the target cannot time a mixed iteration).
  if (grid.chunk_tokens.empty()) return report;
  say("profile: chunked prefill");
  const int64_t n = grid.chunked_prompt_tokens, b = grid.chunked_decode_batch,
                ctx = grid.chunked_decode_context;
  const Result<double> whole = timed(grid.repeats, [&] { return target.mixed_s(b, ctx, n, 0); });
  if (!whole.ok()) return whole.status();
  for (int64_t chunk : grid.chunk_tokens) {
    if (chunk >= n) continue;
    ChunkedPrefill m{.chunk_tokens = chunk,
                     .whole_s = *whole,
                     .predicted_whole_s = perf::CostModel::iteration_time_s(c, b, b * ctx, n, 0)};
    for (int64_t done = 0; done < n; done += chunk, ++m.chunks) {
      const int64_t len = std::min(chunk, n - done);
      const Result<double> t = timed(grid.repeats, [&] { return target.mixed_s(b, ctx, len, done); });
      if (!t.ok()) return t.status();
      m.chunked_s += *t;
      m.predicted_chunked_s += perf::CostModel::iteration_time_s(c, b, b * ctx, len, done);
    }
    report.chunked.push_back(m);
  }
  return report;
}

nlohmann::json to_json(const ProfileReport& r) {
  nlohmann::json j = perf::to_json(r.profile);
  j["residuals"] = {{"prefill_rms_relative", r.prefill_rms_relative},
                    {"decode_rms_relative", r.decode_rms_relative}};
  nlohmann::json points = nlohmann::json::array();
  for (const ProfilePoint& p : r.points) {
    points.push_back({{"kind", p.kind},
                      {p.kind == "prefill" ? "new_tokens" : "batch", p.a},
                      {p.kind == "prefill" ? "prefix_tokens" : "context_tokens", p.b},
                      {"measured_s", p.measured_s},
                      {"fitted_s", p.fitted_s}});
  }
  j["points"] = points;
  nlohmann::json chunked = nlohmann::json::array();
  for (const ChunkedPrefill& m : r.chunked) {
    chunked.push_back({{"chunk_tokens", m.chunk_tokens},
                       {"chunks", m.chunks},
                       {"whole_s", m.whole_s},
                       {"chunked_s", m.chunked_s},
                       {"predicted_whole_s", m.predicted_whole_s},
                       {"predicted_chunked_s", m.predicted_chunked_s}});
  }
  j["chunked_prefill"] = chunked;
  return j;
}

}  // namespace crescent::model
