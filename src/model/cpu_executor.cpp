#include "model/cpu_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <chrono>

#include "model/cpu_limits.h"

namespace crescent::model {

CpuExecutor::CpuExecutor(LlamaForward& model, const CpuExecutorOptions& options)
    : model_(model),
      options_(options),
      cache_(model.kv_layout(options.block_size_tokens), options.capacity_blocks),
      slots_(static_cast<size_t>(options.capacity_blocks)) {}

void CpuExecutor::compute_in_background(std::function<void(int, int)> wait) {
  const int threads = compute_threads();
  compute_thread_ = std::make_unique<ComputeThread>([threads] { set_compute_threads(threads); });
  wait_ = std::move(wait);
  model_.set_on_layer_kv([this](int64_t layer) {
    layers_stored_.store(layer + 1, std::memory_order_release);
    // Only a prompt's layers have somewhere to go: a decode-only pass wakes nobody per layer.
    if (pass_.prefill_request) compute_thread_->notify_progress();
  });
}

Status CpuExecutor::add_request(engine::RequestId id, ExecutorRequest request) {
  const LlamaConfig& c = model_.config();
  const auto n = static_cast<int64_t>(request.prompt.size());
  const auto bad = [&](const std::string& what) {
    return Status::invalid_argument(fmt::format("request {}: {}", id, what));
  };
  if (requests_.contains(id)) return bad("already registered");
  if (n == 0) return bad("the prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return bad(fmt::format("token id {} is outside the model's vocabulary of {}", t, c.vocab_size));
    }
  }
  if (request.output_tokens < 1) return bad(fmt::format("{} output tokens", request.output_tokens));
  if (n + request.output_tokens > c.max_position_embeddings) {
    return bad(
        fmt::format("a prompt of {} tokens and {} output tokens is {} tokens, the model's context is {}", n,
                    request.output_tokens, n + request.output_tokens, c.max_position_embeddings));
  }
  if (static_cast<int64_t>(request.block_keys.size()) != n / options_.block_size_tokens) {
    return bad(fmt::format("{} block keys for {} full blocks", request.block_keys.size(),
                           n / options_.block_size_tokens));
  }
  if (request.top_logprobs < kNoLogprobs || request.top_logprobs > kMaxTopLogprobs) {
    return bad(fmt::format("top_logprobs {} (at most {})", request.top_logprobs, kMaxTopLogprobs));
  }
  CRESCENT_RETURN_IF_ERROR(validate(request.sampling));
  const SamplingParams sampling = request.sampling;
  Request r{.spec = std::move(request), .sampler = Sampler(sampling)};
  r.tokens.reserve(static_cast<size_t>(n + r.spec.output_tokens));
  r.tokens = r.spec.prompt;
  requests_.emplace(id, std::move(r));
  return Status::ok_status();
}

std::span<const int32_t> CpuExecutor::output(engine::RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? std::span<const int32_t>{} : std::span<const int32_t>(it->second.output);
}

std::span<const TokenLogprobs> CpuExecutor::logprobs(engine::RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? std::span<const TokenLogprobs>{}
                               : std::span<const TokenLogprobs>(it->second.logprobs);
}

int64_t CpuExecutor::reused_tokens(engine::RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? 0 : it->second.reused_tokens;
}

std::string CpuExecutor::error(engine::RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? std::string() : it->second.error;
}

std::optional<int32_t> CpuExecutor::allocate() {
  // Nothing is evicted here: the engine's prefix cache decides which keyed blocks go (on_blocks_removed).
  return cache_.allocate();
}

void CpuExecutor::unref(int32_t block) {
  Slot& slot = slots_[static_cast<size_t>(block)];
  assert(slot.refs > 0);
  if (--slot.refs > 0 || slot.key) return;
  cache_.release(block);
}

void CpuExecutor::on_blocks_removed(std::span<const BlockKey> keys) {
  for (BlockKey key : keys) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    Slot& slot = slots_[static_cast<size_t>(it->second)];
    slot.key.reset();
    if (slot.refs == 0) cache_.release(it->second);
    by_key_.erase(it);
  }
}

Status CpuExecutor::import_block(engine::RequestId id, int64_t index, std::span<const std::byte> bytes) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.started) {
    return Status::invalid_argument(fmt::format("request {}: not registered, or its prefill started", id));
  }
  Request& r = it->second;
  if (index < 0 || index >= std::ssize(r.spec.block_keys)) {
    return Status::invalid_argument(fmt::format("request {}: block {} is not one of its {} full blocks", id,
                                                index, r.spec.block_keys.size()));
  }
  const BlockKey key = r.spec.block_keys[static_cast<size_t>(index)];
  if (static_cast<int64_t>(bytes.size()) != cache_.layout().block_bytes()) {
    return Status::invalid_argument(fmt::format("KV block {:016x}: {} bytes, a block of this model is {}",
                                                key, bytes.size(), cache_.layout().block_bytes()));
  }
  if (by_key_.contains(key) || r.imported.contains(index)) return Status::ok_status();
  const std::optional<int32_t> block = allocate();
  if (!block) return Status::out_of_range(fmt::format("KV block {:016x}: every block is in use", key));
  std::ranges::copy(bytes, cache_.block_bytes(*block).begin());
  slots_[static_cast<size_t>(*block)].refs = 1;
  r.imported.emplace(index, *block);
  return Status::ok_status();
}

std::optional<std::span<const std::byte>> CpuExecutor::cached_block(BlockKey key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return cache_.block_bytes(it->second);
}

// The prompt's leading blocks found cached are shared (at most those before its last token, which is always
// computed for its logits and must not be written into a shared block), and its own blocks allocated for
// every position it will compute.
bool CpuExecutor::start_prefill(Request& r) {
  r.started = true;
  const auto n = static_cast<int64_t>(r.spec.prompt.size());
  const int64_t bs = options_.block_size_tokens;
  const int64_t shareable = std::min<int64_t>(static_cast<int64_t>(r.spec.block_keys.size()), (n - 1) / bs);
  int64_t reused_blocks = 0;
  for (; reused_blocks < shareable; ++reused_blocks) {
    if (auto it = by_key_.find(r.spec.block_keys[static_cast<size_t>(reused_blocks)]); it != by_key_.end()) {
      ++slots_[static_cast<size_t>(it->second)].refs;
      r.blocks.push_back(it->second);
    } else if (auto imported = r.imported.find(reused_blocks); imported != r.imported.end()) {
      r.blocks.push_back(imported->second);  // its own, as if computed here
      r.imported.erase(imported);
    } else {
      break;
    }
  }
  // Imported blocks past a gap are of no use: the prompt computes from the gap.
  for (const auto& [index, block] : r.imported) unref(block);
  r.imported.clear();
  r.computed_tokens = r.reused_tokens = reused_blocks * bs;
  const int64_t positions = n + r.spec.output_tokens - 1;  // the last token is never fed back
  while (static_cast<int64_t>(r.blocks.size()) * bs < positions) {
    const std::optional<int32_t> block = allocate();
    if (!block) {
      r.error = fmt::format("no free KV block ({} blocks, all in use)", options_.capacity_blocks);
      return false;
    }
    slots_[static_cast<size_t>(*block)].refs = 1;
    r.blocks.push_back(*block);
  }
  return true;
}

double CpuExecutor::run_iteration_s(const engine::IterationPlan& plan) {
  const auto start = std::chrono::steady_clock::now();
  batch_.clear();
  batch_requests_.clear();
  pass_ = {};
  Request* prefilled = nullptr;  // its prompt's last chunk is in the batch
  if (plan.prefill_request && plan.prefill_tokens > 0) {
    auto it = requests_.find(*plan.prefill_request);
    if (it != requests_.end() && it->second.error.empty() &&
        (it->second.started || start_prefill(it->second))) {
      Request& r = it->second;
      const auto n = static_cast<int64_t>(r.spec.prompt.size());
      const int64_t end = std::min(n, plan.prefill_prefix_tokens + plan.prefill_tokens);
      if (r.computed_tokens < end) {
        const bool last = end == n;
        batch_.push_back({.tokens = std::span(r.tokens).subspan(static_cast<size_t>(r.computed_tokens),
                                                                static_cast<size_t>(end - r.computed_tokens)),
                          .start_position = r.computed_tokens,
                          .block_table = r.blocks,
                          .logits = last ? LogitsWanted::kLast : LogitsWanted::kNone});
        if (last) {
          batch_requests_.push_back(&r);
          prefilled = &r;
        }
        pass_ = {.prefill_request = *plan.prefill_request,
                 .prefill_begin_tokens = r.computed_tokens,
                 .prefill_end_tokens = end};
        r.computed_tokens = end;
      }
    }
  }
  for (engine::RequestId id : plan.decode_ids) {
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second.error.empty() || it->second.output.empty()) continue;
    Request& r = it->second;
    if (static_cast<int64_t>(r.output.size()) >= r.spec.output_tokens) continue;
    const int64_t position = static_cast<int64_t>(r.tokens.size()) - 1;
    batch_.push_back({.tokens = std::span(r.tokens).subspan(static_cast<size_t>(position), 1),
                      .start_position = position,
                      .block_table = r.blocks});
    batch_requests_.push_back(&r);
  }
  if (!batch_.empty()) {
    Result<std::span<const float>> logits = std::span<const float>{};
    if (compute_thread_) {
      layers_stored_.store(0, std::memory_order_release);
      const int progress_fd = compute_thread_->progress_fd();
      compute_thread_->run([&] { logits = model_.forward(batch_, cache_); },
                           [&](int done_fd) { wait_(done_fd, progress_fd); });
    } else {
      logits = model_.forward(batch_, cache_);
    }
    pass_ = {};
    assert(logits.ok());  // add_request checked every input
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    for (size_t i = 0; i < batch_requests_.size(); ++i) {
      Request& r = *batch_requests_[i];
      const std::span<const float> row = logits->subspan(i * vocab, vocab);
      const int32_t token = r.sampler.sample(row);
      r.output.push_back(token);
      r.tokens.push_back(token);
      // Only for a request that asked: the others pay nothing per token.
      if (r.spec.top_logprobs != kNoLogprobs)
        r.logprobs.push_back(token_logprobs(row, token, r.spec.top_logprobs));
    }
  }
  if (prefilled != nullptr && prefix_cache_ != nullptr) {
    // Its full prompt blocks are kept under their keys where the engine's prefix cache holds them (unless
    // another request's bytes are kept under the same key already).
    Request& r = *prefilled;
    for (size_t i = 0; i < r.spec.block_keys.size(); ++i) {
      const BlockKey key = r.spec.block_keys[i];
      if (slots_[static_cast<size_t>(r.blocks[i])].key || !prefix_cache_->contains(key)) continue;
      if (by_key_.emplace(key, r.blocks[i]).second) slots_[static_cast<size_t>(r.blocks[i])].key = key;
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CpuExecutor::release(engine::RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second.spec.keep_after_release) {
    it->second.released = true;
    return;
  }
  drop(id);
}

void CpuExecutor::drop(engine::RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  for (int32_t block : it->second.blocks) unref(block);
  for (const auto& [index, block] : it->second.imported) unref(block);
  requests_.erase(it);
}

std::span<const std::byte> CpuExecutor::kv_block(engine::RequestId id, int64_t index) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || index < 0 || index >= std::ssize(it->second.blocks)) return {};
  return cache_.block_bytes(it->second.blocks[static_cast<size_t>(index)]);
}

Status CpuExecutor::add_decoding(engine::RequestId id, const DecodingRequest& request,
                                 std::span<const std::byte> kv) {
  const LlamaConfig& c = model_.config();
  const int64_t bs = options_.block_size_tokens;
  const auto bad = [&](const std::string& what) {
    return Status::invalid_argument(fmt::format("request {}: {}", id, what));
  };
  if (requests_.contains(id)) return bad("already registered");
  if (request.prompt_tokens < 1 || request.output_tokens < 2 ||
      request.prompt_tokens + request.output_tokens > c.max_position_embeddings) {
    return bad(fmt::format("{} prompt and {} output tokens (context {})", request.prompt_tokens,
                           request.output_tokens, c.max_position_embeddings));
  }
  if (request.first_token < 0 || request.first_token >= c.vocab_size) {
    return bad(
        fmt::format("first token {} is outside the vocabulary of {}", request.first_token, c.vocab_size));
  }
  const int64_t prompt_blocks = (request.prompt_tokens + bs - 1) / bs;
  const int64_t block_bytes = cache_.layout().block_bytes();
  if (std::ssize(kv) != prompt_blocks * block_bytes) {
    return bad(fmt::format("{} KV bytes, {} blocks of {} expected", kv.size(), prompt_blocks, block_bytes));
  }
  if (request.top_logprobs < kNoLogprobs || request.top_logprobs > kMaxTopLogprobs) {
    return bad(fmt::format("top_logprobs {} (at most {})", request.top_logprobs, kMaxTopLogprobs));
  }
  CRESCENT_RETURN_IF_ERROR(validate(request.sampling));
  Request r{.spec = {.output_tokens = request.output_tokens,
                     .sampling = request.sampling,
                     .top_logprobs = request.top_logprobs},
            .sampler = Sampler(request.sampling)};
  // The prefill drew the first token (a draw only when sampling at a temperature).
  if (request.sampling.temperature > 0) r.sampler.discard(1);
  const int64_t positions = request.prompt_tokens + request.output_tokens - 1;
  while (std::ssize(r.blocks) * bs < positions) {
    const std::optional<int32_t> block = allocate();
    if (!block) {
      for (int32_t b : r.blocks) unref(b);
      return Status::out_of_range(
          fmt::format("request {}: no free KV block ({} blocks, all in use)", id, options_.capacity_blocks));
    }
    slots_[static_cast<size_t>(*block)].refs = 1;
    r.blocks.push_back(*block);
  }
  for (int64_t b = 0; b < prompt_blocks; ++b) {
    std::ranges::copy(kv.subspan(static_cast<size_t>(b * block_bytes), static_cast<size_t>(block_bytes)),
                      cache_.block_bytes(r.blocks[static_cast<size_t>(b)]).begin());
  }
  r.started = true;
  r.computed_tokens = request.prompt_tokens;
  r.tokens.reserve(static_cast<size_t>(positions + 1));
  r.tokens.assign(static_cast<size_t>(request.prompt_tokens),
                  0);  // their KV is here; their ids are not needed
  r.tokens.push_back(request.first_token);
  r.output.push_back(request.first_token);
  requests_.emplace(id, std::move(r));
  return Status::ok_status();
}

}  // namespace crescent::model
