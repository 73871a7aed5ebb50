#include "trace/transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <queue>
#include <utility>

#include "trace/reader.h"

namespace crescent::trace {
namespace {

// Times and lengths are kept below 2^53, where a double holds every integer: scaling is then exact enough
// that rounding never reorders.
constexpr double kMaxScaled = 9007199254740992.0;  // 2^53
// A generous upper bound of one JSON number's characters in a trace line ("18446744073709551615,").
constexpr size_t kMaxNumberChars = 21;

// One input of a merge: its requests rebased to the merge's origin, keys and sessions numbered apart.
class InputSource final : public RequestSource {
 public:
  InputSource(std::string path, std::unique_ptr<TraceReader> reader, Request first, int64_t index,
              int64_t inputs, int64_t max_session_id, bool derive_keys)
      : path_(std::move(path)),
        reader_(std::move(reader)),
        pending_(std::move(first)),
        has_pending_(true),
        index_(index),
        inputs_(inputs),
        max_session_id_(max_session_id),
        derive_keys_(derive_keys) {}

  int64_t first_arrival_ms() const { return pending_.timestamp_ms; }
  void set_origin_ms(int64_t origin_ms) { origin_ms_ = origin_ms; }

  Result<bool> next(Request& out) override {
    if (has_pending_) {
      out = std::move(pending_);
      has_pending_ = false;
    } else {
      Result<bool> read = reader_->next(out);
      if (!read.ok() || !*read) return read;
    }
    out.timestamp_ms -= origin_ms_;
    if (derive_keys_) {
      for (BlockKey& key : out.block_keys) key = derive_key(key, KeyDerivation::kMergeInput, index_);
      out.token_ids.clear();
    }
    if (out.session_id) {
      if (*out.session_id > max_session_id_) {
        return Status::invalid_argument(
            fmt::format("{}:{}: field 'session_id': {} is too large to number the sessions apart (at most {} "
                        "for {} input(s) and these copies)",
                        path_, out.line, *out.session_id, max_session_id_, inputs_));
      }
      out.session_id = *out.session_id * inputs_ + index_;
    }
    return true;
  }

 private:
  std::string path_;
  std::unique_ptr<TraceReader> reader_;
  Request pending_;  // the first request, read to find the origin
  bool has_pending_;
  int64_t index_;
  int64_t inputs_;
  int64_t max_session_id_;
  bool derive_keys_;
  int64_t origin_ms_ = 0;
};

class MergedSource final : public RequestSource {
 public:
  explicit MergedSource(std::vector<std::unique_ptr<RequestSource>> sources) : sources_(std::move(sources)) {
    heads_.resize(sources_.size());
  }

  Result<bool> next(Request& out) override {
    if (!failed_.ok()) return failed_;
    if (!started_) {
      started_ = true;
      for (size_t i = 0; i < sources_.size(); ++i) {
        if (Status status = advance(i); !status.ok()) return fail(status);
      }
    }
    if (queue_.empty()) return false;
    const size_t i = queue_.top().second;
    queue_.pop();
    out = std::move(heads_[i]);
    // An error reading ahead is the next call's: the request before it is delivered, as a reader would.
    if (Status status = advance(i); !status.ok()) failed_ = std::move(status);
    return true;
  }

 private:
  // (timestamp, source): the smallest first, ties to the smaller source index.
  using Entry = std::pair<int64_t, size_t>;

  // Reads source i's next request into its head and queues it.
  Status advance(size_t i) {
    Result<bool> read = sources_[i]->next(heads_[i]);
    if (!read.ok()) return read.status();
    if (*read) queue_.emplace(heads_[i].timestamp_ms, i);
    return Status::ok_status();
  }
  Result<bool> fail(Status status) {
    failed_ = std::move(status);
    return failed_;
  }

  std::vector<std::unique_ptr<RequestSource>> sources_;
  std::vector<Request> heads_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue_;
  bool started_ = false;
  Status failed_;
};

class WindowSource final : public RequestSource {
 public:
  WindowSource(std::unique_ptr<RequestSource> source, TimeWindow window)
      : source_(std::move(source)), window_(window) {}

  Result<bool> next(Request& out) override {
    if (done_) return false;
    for (;;) {
      Result<bool> read = source_->next(out);
      if (!read.ok() || !*read) return read;
      if (window_.end_ms && out.timestamp_ms >= *window_.end_ms) {
        done_ = true;  // arrivals never decrease: nothing later is inside
        return false;
      }
      if (out.timestamp_ms < window_.start_ms) continue;
      out.timestamp_ms -= window_.start_ms;
      return true;
    }
  }

 private:
  std::unique_ptr<RequestSource> source_;
  TimeWindow window_;
  bool done_ = false;
};

class CopySource final : public RequestSource {
 public:
  CopySource(std::unique_ptr<RequestSource> source, const CopyPlan& plan, int64_t copy, bool wrapped)
      : source_(std::move(source)), plan_(plan), copy_(copy), wrapped_(wrapped) {}

  Result<bool> next(Request& out) override {
    for (;;) {
      Result<bool> read = source_->next(request_);
      if (!read.ok() || !*read) return read;
      if (plan_.wraps(request_, copy_) != wrapped_) continue;
      out = copy_request(request_, copy_, plan_);
      return true;
    }
  }

 private:
  std::unique_ptr<RequestSource> source_;
  const CopyPlan& plan_;
  int64_t copy_;
  bool wrapped_;
  Request request_;
};

// The steps before the copies: the merged inputs and the window.
Result<std::unique_ptr<RequestSource>> open_windowed(const std::vector<std::string>& inputs,
                                                     const TransformOptions& options) {
  Result<std::unique_ptr<RequestSource>> merged = open_merged_inputs(inputs, options.merge);
  if (!merged.ok() || !options.window) return merged;
  return window_source(std::move(merged).value(), *options.window);
}

// "12.5 s" for ms.
std::string seconds(int64_t ms) {
  return fmt::format("{} s", static_cast<double>(ms) / 1000.0);
}

// Only a window can leave no request: every input has one (open_merged_inputs).
Status empty_window_error(const TransformOptions& options) {
  const TimeWindow window = options.window.value_or(TimeWindow{});
  return Status::invalid_argument(
      fmt::format("no request arrives in the window [{}, {}) (times from the {})", seconds(window.start_ms),
                  window.end_ms ? seconds(*window.end_ms) : "end",
                  options.merge.absolute_time ? "earliest first arrival of the inputs" : "first arrival"));
}

Status check_options(const std::vector<std::string>& inputs, const TransformOptions& options) {
  auto bad = [](std::string message) { return Status::invalid_argument(std::move(message)); };
  if (inputs.empty()) return bad("no input trace");
  if (options.merge.block_size_tokens < 1) {
    return bad(fmt::format("block size must be >= 1 token, got {}", options.merge.block_size_tokens));
  }
  if (options.copies < 1) return bad(fmt::format("copies must be >= 1, got {}", options.copies));
  if (options.window) {
    const TimeWindow& w = *options.window;
    if (w.start_ms < 0) return bad(fmt::format("window start must be >= 0, got {} ms", w.start_ms));
    if (w.end_ms && *w.end_ms <= w.start_ms) {
      return bad(fmt::format("window end ({} ms) must be after its start ({} ms)", *w.end_ms, w.start_ms));
    }
  }
  for (auto [name, value] :
       {std::pair{"rate scale", options.rate_scale}, std::pair{"input length scale", options.length.input},
        std::pair{"output length scale", options.length.output}}) {
    if (!(value > 0) || !std::isfinite(value)) return bad(fmt::format("{} must be > 0, got {}", name, value));
  }
  return Status::ok_status();
}

}  // namespace

BlockKey derive_key(BlockKey key, KeyDerivation kind, int64_t index) {
  const std::array<int64_t, 2> tag{static_cast<int64_t>(kind), index};
  return kv::chain_block_key(key, tag);
}

Result<std::unique_ptr<RequestSource>> open_merged_inputs(const std::vector<std::string>& paths,
                                                          const MergeOptions& options) {
  const int64_t inputs = static_cast<int64_t>(paths.size());
  if (inputs < 1) return Status::invalid_argument("no input trace");
  if (options.later_session_spread < 1 ||
      options.later_session_spread > std::numeric_limits<int32_t>::max() / inputs) {
    return Status::invalid_argument(
        fmt::format("cannot number sessions apart {} x {} ways", inputs, options.later_session_spread));
  }
  // Ids s become s x spread + (spread - 1) at most, which must stay below 2^63.
  const int64_t spread = inputs * options.later_session_spread;
  const int64_t max_session_id = (std::numeric_limits<int64_t>::max() - (spread - 1)) / spread;

  std::vector<std::unique_ptr<InputSource>> sources;
  for (int64_t i = 0; i < inputs; ++i) {
    const std::string& path = paths[static_cast<size_t>(i)];
    Result<std::unique_ptr<TraceReader>> reader =
        TraceReader::open(path, {.block_size_tokens = options.block_size_tokens});
    if (!reader.ok()) return reader.status();
    Request first;
    Result<bool> read = (*reader)->next(first);
    if (!read.ok()) return read.status();
    if (!*read) return empty_trace_error(path, (*reader)->skipped());
    sources.push_back(std::make_unique<InputSource>(path, std::move(reader).value(), std::move(first), i,
                                                    inputs, max_session_id, i > 0 && !options.shared_keys));
  }
  int64_t earliest_ms = std::numeric_limits<int64_t>::max();
  for (const auto& source : sources) earliest_ms = std::min(earliest_ms, source->first_arrival_ms());
  for (const auto& source : sources) {
    source->set_origin_ms(options.absolute_time ? earliest_ms : source->first_arrival_ms());
  }
  if (sources.size() == 1) return std::unique_ptr<RequestSource>(std::move(sources.front()));
  std::vector<std::unique_ptr<RequestSource>> merged(std::make_move_iterator(sources.begin()),
                                                     std::make_move_iterator(sources.end()));
  return merge_sources(std::move(merged));
}

std::unique_ptr<RequestSource> window_source(std::unique_ptr<RequestSource> source, TimeWindow window) {
  return std::make_unique<WindowSource>(std::move(source), window);
}

size_t CopyPlanner::PairHash::operator()(const std::pair<BlockKey, int64_t>& p) const {
  return std::hash<BlockKey>()(p.first * 0x9E3779B97F4A7C15ull ^ static_cast<BlockKey>(p.second));
}

void CopyPlanner::add(const Request& request) {
  // A request without a session id is a session of its own, seen once: a negative id no real session has.
  const int64_t session = request.session_id ? *request.session_id : -1 - requests_;
  ++requests_;
  if (request.session_id) {
    session_first_arrival_ms_.try_emplace(session, request.timestamp_ms);
  } else {
    ++requests_without_session_;
  }
  last_arrival_ms_ = request.timestamp_ms;
  for (BlockKey key : request.block_keys) {
    auto [it, inserted] = keys_.try_emplace(key, KeySessions{session, session, 1});
    KeySessions& refs = it->second;
    if (inserted || refs.last_session == session || refs.first_session == session) continue;
    refs.last_session = session;
    // A session of one request is new here; a session with an id may have been counted before, between
    // others (sessions interleave), which only the pairs beyond the first session tell.
    if (session < 0 || later_sessions_.emplace(key, session).second) ++refs.sessions;
  }
}

Result<CopyPlan> CopyPlanner::finish(int64_t copies, const SharedThreshold& threshold,
                                     std::optional<int64_t> period_ms) {
  if (requests_ == 0) return Status::invalid_argument("no requests to copy");
  if (copies < 1) return Status::invalid_argument(fmt::format("copies must be >= 1, got {}", copies));
  if (period_ms && *period_ms < 1) {
    return Status::invalid_argument(fmt::format("the copies' period must be >= 1 ms, got {}", *period_ms));
  }
  CopyPlan plan;
  plan.copies = copies;
  plan.period_ms = period_ms.value_or(last_arrival_ms_ + 1);
  plan.sessions = static_cast<int64_t>(session_first_arrival_ms_.size()) + requests_without_session_;
  plan.by_session_ids = requests_without_session_ == 0;
  plan.distinct_keys = static_cast<int64_t>(keys_.size());
  if (threshold.min_sessions && threshold.min_percent) {
    return Status::invalid_argument(
        "give the shared-block threshold as sessions or as a percentage, not both");
  }
  if (threshold.min_sessions) {
    if (*threshold.min_sessions < 1) {
      return Status::invalid_argument(
          fmt::format("the shared-block threshold must be >= 1 session, got {}", *threshold.min_sessions));
    }
    plan.min_sessions = *threshold.min_sessions;
  } else {
    const double percent = threshold.min_percent.value_or(plan.by_session_ids ? 0 : 1);
    if (threshold.min_percent && !(percent > 0 && percent <= 100)) {
      return Status::invalid_argument(
          fmt::format("the shared-block threshold must be in (0, 100] %, got {}", percent));
    }
    if (percent == 0) {
      plan.min_sessions = 2;
    } else {
      // Whole percentages are exact; the tolerance keeps a product meant to be whole from rounding up past
      // it (0.07% of 10000 computes as 7.000000000000001 sessions: 7, not 8).
      const double sessions = percent * static_cast<double>(plan.sessions) / 100.0;
      plan.min_sessions = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(sessions - 1e-9 * sessions)));
      // The default share never makes a block of one request shared (in a trace of < 200 requests, 1% is 1).
      if (!threshold.min_percent) plan.min_sessions = std::max<int64_t>(2, plan.min_sessions);
    }
  }
  for (const auto& [key, refs] : keys_) {
    if (refs.sessions >= plan.min_sessions) plan.shared_keys.insert(key);
  }
  plan.session_first_arrival_ms = std::move(session_first_arrival_ms_);
  keys_.clear();
  later_sessions_.clear();
  return plan;
}

int64_t CopyPlan::offset_ms(int64_t copy) const {
  return std::llround(static_cast<double>(copy) * static_cast<double>(period_ms) /
                      static_cast<double>(copies));
}

bool CopyPlan::wraps(const Request& request, int64_t copy) const {
  if (copy == 0) return false;
  int64_t first_arrival_ms = request.timestamp_ms;
  if (request.session_id) {
    auto it = session_first_arrival_ms.find(*request.session_id);
    if (it != session_first_arrival_ms.end()) first_arrival_ms = it->second;
  }
  return first_arrival_ms + offset_ms(copy) >= period_ms;
}

Request copy_request(const Request& request, int64_t copy, const CopyPlan& plan) {
  Request out = request;
  if (copy > 0) {
    bool own = false;  // past the leading run of shared keys: the copy's own blocks
    for (BlockKey& key : out.block_keys) {
      own = own || !plan.shared_keys.contains(key);
      if (own) key = derive_key(key, KeyDerivation::kCopy, copy);
    }
    if (own) out.token_ids.clear();
  }
  if (out.session_id) out.session_id = *out.session_id * plan.copies + copy;
  out.timestamp_ms += plan.offset_ms(copy) - (plan.wraps(request, copy) ? plan.period_ms : 0);
  return out;
}

std::unique_ptr<RequestSource> copy_source(std::unique_ptr<RequestSource> source, const CopyPlan& plan,
                                           int64_t copy, bool wrapped) {
  return std::make_unique<CopySource>(std::move(source), plan, copy, wrapped);
}

std::unique_ptr<RequestSource> merge_sources(std::vector<std::unique_ptr<RequestSource>> sources) {
  return std::make_unique<MergedSource>(std::move(sources));
}

Status scale_lengths(Request& request, const LengthScale& scale, int64_t block_size_tokens) {
  if (scale.input != 1) {
    const double scaled = std::round(static_cast<double>(request.input_tokens) * scale.input);
    const int64_t blocks_at_most = static_cast<int64_t>(kMaxLineBytes / kMaxNumberChars);
    if (scaled >= kMaxScaled || scaled / static_cast<double>(block_size_tokens) >= blocks_at_most) {
      return Status::invalid_argument(
          fmt::format("input_length {} x {} = {} tokens is too long for a trace line (the request on line {} "
                      "of its input)",
                      request.input_tokens, scale.input, scaled, request.line));
    }
    const int64_t input_tokens = std::max<int64_t>(1, static_cast<int64_t>(scaled));
    const int64_t old_blocks = static_cast<int64_t>(request.block_keys.size());
    const int64_t blocks = (input_tokens + block_size_tokens - 1) / block_size_tokens;
    std::vector<BlockKey> keys(static_cast<size_t>(blocks));
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t end = std::min((j + 1) * block_size_tokens, input_tokens);   // one past the block
      const double old_end = std::ceil(static_cast<double>(end) / scale.input);  // one past its old prefix
      const int64_t old_block =
          std::min(old_blocks - 1, static_cast<int64_t>(old_end - 1) / block_size_tokens);
      keys[static_cast<size_t>(j)] =
          derive_key(request.block_keys[static_cast<size_t>(old_block)], KeyDerivation::kLengthScale, j);
    }
    request.input_tokens = input_tokens;
    request.block_keys = std::move(keys);
    request.token_ids.clear();
  }
  if (scale.output != 1) {
    const double scaled = std::round(static_cast<double>(request.output_tokens) * scale.output);
    if (scaled >= kMaxScaled) {
      return Status::invalid_argument(
          fmt::format("output_length {} x {} = {} tokens is too long (the request on line {} of its input)",
                      request.output_tokens, scale.output, scaled, request.line));
    }
    request.output_tokens = std::max<int64_t>(1, static_cast<int64_t>(scaled));
  }
  return Status::ok_status();
}

Result<int64_t> scale_arrival_ms(int64_t timestamp_ms, double rate_scale) {
  const double scaled = std::round(static_cast<double>(timestamp_ms) / rate_scale);
  if (scaled >= kMaxScaled) {
    return Status::invalid_argument(fmt::format("arrival {} ms / rate scale {} = {} ms is past 2^53 ms",
                                                timestamp_ms, rate_scale, scaled));
  }
  return static_cast<int64_t>(scaled);
}

BlockKey DenseKeys::map(BlockKey key) {
  return ids_.try_emplace(key, static_cast<BlockKey>(ids_.size())).first->second;
}

Result<TransformReport> transform_trace(const std::vector<std::string>& inputs,
                                        const TransformOptions& options, TraceWriter& out) {
  CRESCENT_RETURN_IF_ERROR(check_options(inputs, options));
  TransformOptions opts = options;
  opts.merge.later_session_spread = options.copies;
  TransformReport report;

  // The copies' plan: a first pass over the merged, windowed trace.
  CopyPlan plan;
  if (options.copies > 1) {
    Result<std::unique_ptr<RequestSource>> first_pass = open_windowed(inputs, opts);
    if (!first_pass.ok()) return first_pass.status();
    CopyPlanner planner;
    Request request;
    for (;;) {
      Result<bool> read = (*first_pass)->next(request);
      if (!read.ok()) return read.status();
      if (!*read) break;
      planner.add(request);
    }
    std::optional<int64_t> period_ms;
    if (options.window && options.window->end_ms)
      period_ms = *options.window->end_ms - options.window->start_ms;
    if (planner.requests() == 0) return empty_window_error(options);
    Result<CopyPlan> made = planner.finish(options.copies, options.shared, period_ms);
    if (!made.ok()) return made.status();
    plan = std::move(made).value();
  }

  std::vector<std::unique_ptr<RequestSource>> parts;
  for (int64_t copy = 0; copy < options.copies; ++copy) {
    for (bool wrapped : {false, true}) {
      if (copy == 0 && wrapped) continue;  // copy 0 starts at 0: nothing wraps
      Result<std::unique_ptr<RequestSource>> part = open_windowed(inputs, opts);
      if (!part.ok()) return part.status();
      parts.push_back(options.copies > 1 ? copy_source(std::move(part).value(), plan, copy, wrapped)
                                         : std::move(part).value());
    }
  }
  std::unique_ptr<RequestSource> source =
      parts.size() == 1 ? std::move(parts.front()) : merge_sources(std::move(parts));

  DenseKeys dense;
  Request request;
  int64_t last_ms = 0;
  for (;;) {
    Result<bool> read = source->next(request);
    if (!read.ok()) return read.status();
    if (!*read) break;
    CRESCENT_RETURN_IF_ERROR(scale_lengths(request, options.length, options.merge.block_size_tokens));
    if (options.rate_scale != 1) {
      Result<int64_t> scaled = scale_arrival_ms(request.timestamp_ms, options.rate_scale);
      if (!scaled.ok()) return scaled.status();
      request.timestamp_ms = *scaled;
    }
    if (options.dense_ids) {
      for (BlockKey& key : request.block_keys) key = dense.map(key);
      request.token_ids.clear();
    }
    if ((request.block_keys.size() + request.token_ids.size() + 8) * kMaxNumberChars > kMaxLineBytes &&
        format_trace_line(request).size() > kMaxLineBytes) {
      return Status::invalid_argument(
          fmt::format("the output's request {} would be a line longer than {} bytes", report.requests_out + 1,
                      kMaxLineBytes));
    }
    CRESCENT_RETURN_IF_ERROR(out.append(request));
    ++report.requests_out;
    last_ms = request.timestamp_ms;
  }
  if (report.requests_out == 0) return empty_window_error(options);
  report.requests_in = report.requests_out / options.copies;
  report.span_s = static_cast<double>(last_ms) / 1000.0;
  if (options.copies > 1) {
    report.copies = CopySummary{.sessions = plan.sessions,
                                .by_session_ids = plan.by_session_ids,
                                .min_sessions = plan.min_sessions,
                                .shared_keys = static_cast<int64_t>(plan.shared_keys.size()),
                                .distinct_keys = plan.distinct_keys,
                                .period_ms = plan.period_ms};
  }
  return report;
}

}  // namespace crescent::trace
