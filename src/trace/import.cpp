#include "trace/import.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <functional>
#include <random>

#include "kv/block_key.h"
#include "trace/reader.h"

namespace crescent::trace {

TraceImporter::TraceImporter(ImportOptions options, TraceWriter& out)
    : options_(std::move(options)),
      out_(out),
      seed_(XXH3_64bits(options_.salt.data(), options_.salt.size())),
      // A different chain for lengths-only requests, so their keys never meet a real prompt's, and a new one
      // each run, so two imports that share a salt do not share lengths-only keys either.
      unique_seed_(XXH3_64bits_withSeed(options_.salt.data(), options_.salt.size(), std::random_device{}())) {
}

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
  // Block counts a trace line can carry (kMaxLineBytes, at least 2 bytes a key): refused before the keys
  // are made, so a huge length in a 30-byte log row cannot take gigabytes.
  const int64_t blocks = logged.input_tokens / options_.block_size_tokens +
                         (logged.input_tokens % options_.block_size_tokens != 0);
  if (blocks > static_cast<int64_t>(kMaxLineBytes / 2)) {
    return Status::invalid_argument(
        fmt::format("{}: {} input tokens are {} blocks of {}, more than a trace line can hold ({} bytes)",
                    logged.where, logged.input_tokens, blocks, options_.block_size_tokens, kMaxLineBytes));
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
  const bool lengths_only = logged.token_ids.empty();
  if (lengths_only) {
    // Lengths only: every block a key of its own (the request's sequence number and the block's index).
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
  held_.push_back(
      Held{logged.timestamp_ms, sequence_++, std::move(request), std::move(logged.session), lengths_only});
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
  if (held.lengths_only) {
    // Keys no other request has: numbered (dense) or kept (raw), never remembered.
    for (BlockKey& key : request.block_keys) {
      if (options_.dense_ids) key = next_dense_id_++;
    }
    report_.distinct_blocks += static_cast<int64_t>(request.block_keys.size());
  } else if (options_.dense_ids) {
    for (BlockKey& key : request.block_keys) {
      const auto [it, added] = dense_.try_emplace(key, next_dense_id_);
      if (added) {
        ++next_dense_id_;
        ++report_.distinct_blocks;
      }
      key = it->second;
    }
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
