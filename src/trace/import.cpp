#include "trace/import.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <functional>

#include "kv/block_key.h"

namespace crescent::trace {

TraceImporter::TraceImporter(ImportOptions options, TraceWriter& out)
    : options_(std::move(options)),
      out_(out),
      seed_(XXH3_64bits(options_.salt.data(), options_.salt.size())),
      // A different chain for lengths-only requests, so their keys never meet a real prompt's.
      unique_seed_(XXH3_64bits_withSeed(options_.salt.data(), options_.salt.size(), 0x6c656e67746873ull)) {}

Status TraceImporter::add(LoggedRequest logged) {
  if (logged.input_tokens < 1) {
    return Status::invalid_argument(fmt::format("{}: the prompt has no tokens", logged.where));
  }
  if (logged.output_tokens < 1) {
    return Status::invalid_argument(
        fmt::format("{}: output tokens must be >= 1, got {}", logged.where, logged.output_tokens));
  }
  if (!logged.token_ids.empty() && static_cast<int64_t>(logged.token_ids.size()) != logged.input_tokens) {
    return Status::invalid_argument(fmt::format("{}: {} token ids for an input of {} tokens", logged.where,
                                                logged.token_ids.size(), logged.input_tokens));
  }
  if (released_until_ms_ && logged.timestamp_ms < *released_until_ms_) {
    return Status::invalid_argument(fmt::format(
        "{}: arrives at {} ms, {:.3f} s before requests already written (the log is out of order by more "
        "than the reorder window: raise --reorder-window-s or sort the log by time)",
        logged.where, logged.timestamp_ms,
        static_cast<double>(*released_until_ms_ - logged.timestamp_ms) / 1000.0));
  }
  Request request;
  request.timestamp_ms = logged.timestamp_ms;
  request.input_tokens = logged.input_tokens;
  request.output_tokens = logged.output_tokens;
  if (logged.token_ids.empty()) {
    // Lengths only: every block a key of its own (the request's sequence number and the block's index).
    const int64_t blocks =
        (logged.input_tokens + options_.block_size_tokens - 1) / options_.block_size_tokens;
    request.block_keys.reserve(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < blocks; ++i) {
      const std::array<int64_t, 2> position{sequence_, i};
      request.block_keys.push_back(kv::chain_block_key(unique_seed_, position));
    }
    ++report_.lengths_only_requests;
  } else {
    request.block_keys = kv::shipped_block_keys(logged.token_ids, options_.block_size_tokens, seed_);
    if (options_.keep_tokens) request.token_ids = std::move(logged.token_ids);
  }
  held_.push_back(Held{logged.timestamp_ms, sequence_++, std::move(request), std::move(logged.session)});
  std::push_heap(held_.begin(), held_.end(), std::greater<>());
  return Status();
}

Status TraceImporter::write(Held& held) {
  Request& request = held.request;
  if (!first_timestamp_ms_) {
    first_timestamp_ms_ = held.timestamp_ms;
    report_.first_timestamp_ms = held.timestamp_ms;
  }
  request.timestamp_ms = held.timestamp_ms - *first_timestamp_ms_;
  if (options_.dense_ids) {
    for (BlockKey& key : request.block_keys) {
      key = dense_.try_emplace(key, static_cast<BlockKey>(dense_.size())).first->second;
    }
    report_.distinct_blocks = static_cast<int64_t>(dense_.size());
  } else {
    for (BlockKey key : request.block_keys) {
      if (dense_.try_emplace(key, 0).second) ++report_.distinct_blocks;
    }
  }
  if (held.session) {
    request.session_id =
        sessions_.try_emplace(*held.session, static_cast<int64_t>(sessions_.size())).first->second;
    report_.sessions = static_cast<int64_t>(sessions_.size());
  }
  ++report_.requests;
  report_.input_tokens += request.input_tokens;
  report_.output_tokens += request.output_tokens;
  return out_.append(request);
}

TraceImporter::Held TraceImporter::pop_earliest() {
  std::pop_heap(held_.begin(), held_.end(), std::greater<>());
  Held held = std::move(held_.back());
  held_.pop_back();
  return held;
}

Status TraceImporter::release_before(int64_t timestamp_ms) {
  while (!held_.empty() && held_.front().timestamp_ms < timestamp_ms) {
    Held held = pop_earliest();
    CRESCENT_RETURN_IF_ERROR(write(held));
  }
  if (!released_until_ms_ || timestamp_ms > *released_until_ms_) released_until_ms_ = timestamp_ms;
  return Status();
}

Status TraceImporter::finish() {
  while (!held_.empty()) {
    Held held = pop_earliest();
    CRESCENT_RETURN_IF_ERROR(write(held));
    released_until_ms_ = held.timestamp_ms;
  }
  return Status();
}

}  // namespace crescent::trace
