// The Llama forward pass on CPU (issue 11): token embedding, per layer RMSNorm, rotary position embedding
// (HF's rotate-half convention, theta from the config), grouped-query attention over a paged KV cache and
// a SwiGLU MLP, then the final norm and the LM head. fp32 compute (bf16 weights are widened once, at
// construction). The linear layers are oneDNN matmuls over weights packed once (PackedLinear); attention's
// products are OpenBLAS's cblas_sgemm.
//
// The KV cache is paged: fixed blocks of block_size tokens whose bytes are exactly what the pool stores and
// the transfer engine moves (KvBlockLayout). New tokens' K and V are written to their blocks first and
// attention then reads every position, new ones included, back from the blocks: a token's output depends
// only on the blocks' bytes, so KV computed here, in another process or earlier is used the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "model/llama.h"
#include "model/packed_linear.h"

namespace crescent::model {

/// How one block's KV sits in its bytes: [layer][K, V][kv_head][token][head_dim], elements of the model's
/// dtype. A block is block_size_tokens × LlamaConfig::kv_bytes_per_token() bytes, and one KV head's keys (or
/// values) in a layer are a contiguous [tokens, head_dim] matrix.
struct KvBlockLayout {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size_tokens = 0;
  DType dtype = DType::kF32;

  /// Elements of one block.
  int64_t block_elements() const { return layers * 2 * kv_heads * block_size_tokens * head_dim; }
  /// Bytes of one block.
  int64_t block_bytes() const { return block_elements() * static_cast<int64_t>(dtype_bytes(dtype)); }
  /// Element offset in a block of token slot `slot` of KV head `head`'s keys (kv = 0) or values (kv = 1) in
  /// layer `layer`.
  int64_t offset(int64_t layer, int64_t kv, int64_t head, int64_t slot) const {
    return (((layer * 2 + kv) * kv_heads + head) * block_size_tokens + slot) * head_dim;
  }
  bool operator==(const KvBlockLayout&) const = default;
};

/// An instance's KV memory: `capacity_blocks` blocks in one buffer (one region for the transfer engine to
/// register), handed out and returned by index. Not thread-safe.
class PagedKvCache {
 public:
  /// REQUIRES: every field of `layout` >= 1; capacity_blocks >= 1. The memory is allocated here, zeroed
  /// (calloc: pages the OS maps on first use, so an unused capacity costs no resident memory).
  PagedKvCache(const KvBlockLayout& layout, int64_t capacity_blocks);

  const KvBlockLayout& layout() const { return layout_; }
  int64_t capacity_blocks() const { return capacity_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  /// A free block's index (its bytes are whatever its last user left), or nullopt when all are in use.
  std::optional<int32_t> allocate();
  /// Returns `block` to the free blocks. REQUIRES: allocated and not released since.
  void release(int32_t block);
  /// Block `block`'s bytes (layout().block_bytes() long). REQUIRES: 0 <= block < capacity_blocks().
  std::span<std::byte> block_bytes(int32_t block);
  std::span<const std::byte> block_bytes(int32_t block) const;
  /// All blocks, block i at i × block_bytes().
  std::span<std::byte> bytes() { return {buffer_.get(), bytes_}; }

 private:
  KvBlockLayout layout_;
  int64_t capacity_blocks_ = 0;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  size_t bytes_ = 0;
  std::unique_ptr<std::byte, Free> buffer_;
  std::vector<int32_t> free_;  // a stack: the most recently released block is reused first
};

/// Which logits a sequence of a forward batch wants.
enum class LogitsWanted {
  kNone,  // a prefill chunk that is not the prompt's last
  kLast,  // the next token after the sequence's last (a prompt's end, a decode step)
  kAll,   // one row per new token (tests)
};

/// One sequence's part of a forward batch: `tokens` at positions start_position, start_position + 1, ...
/// whose K and V go to the blocks of `block_table`, which already hold the first start_position tokens'.
struct ForwardSequence {
  std::span<const int32_t> tokens;       // >= 1 token ids, each < vocab_size
  int64_t start_position = 0;            // tokens before them with their KV in the blocks
  std::span<const int32_t> block_table;  // the blocks of positions [0, start + tokens), in order
  LogitsWanted logits = LogitsWanted::kLast;
};

/// A model ready to run: fp32 weights (q/k/v and gate/up fused into one matrix each) and rotary tables.
/// forward() reuses scratch buffers, so one object runs one batch at a time.
class LlamaForward {
 public:
  /// Reads `model`'s weights (checked by load_llama_model); `model` may be destroyed afterwards.
  explicit LlamaForward(const LlamaModel& model);

  const LlamaConfig& config() const { return config_; }
  /// The block layout of this model's KV for blocks of `block_size_tokens` tokens (>= 1).
  KvBlockLayout kv_layout(int64_t block_size_tokens) const;

  /// Computes every sequence's new tokens in one pass (their rows share each matrix product): writes their
  /// K and V into their blocks of `cache`, and returns the logits wanted, vocab_size floats per row, the
  /// sequences' rows in batch order (kLast: one, kAll: one per token). The span is valid until the next
  /// call. Errors (kInvalidArgument, the cache untouched): an empty batch or sequence, a token id outside the
  /// vocabulary, a position at or past max_position_embeddings, a block table too short or naming a block
  /// outside the cache, a cache whose layout is not kv_layout() of its block size.
  Result<std::span<const float>> forward(std::span<const ForwardSequence> batch, PagedKvCache& cache);
  /// Called by forward() once it has written layer `layer`'s K and V of every new token of the batch (paper
  /// §3.1 step 3: that layer's KV can ship while later layers compute), on the thread running forward().
  /// Empty: not called.
  void set_on_layer_kv(std::function<void(int64_t layer)> on_layer_kv) {
    on_layer_kv_ = std::move(on_layer_kv);
  }

  /// Matrix-product FLOPs of computing `new_tokens` after `prefix_tokens` of context, logits of one row:
  /// 2 × (weights' multiply-adds per token × new tokens + attention's QK^T and PV over the causal triangle).
  /// What a prefill's FLOP rate is measured against.
  double prefill_flops(int64_t new_tokens, int64_t prefix_tokens) const;

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [hidden]
    PackedLinear wqkv;             // [(heads + 2 × kv_heads) × head_dim, hidden]: q, k, v rows
    PackedLinear wo;               // [hidden, heads × head_dim]
    std::vector<float> mlp_norm;   // [hidden]
    PackedLinear wgate_up;         // [2 × intermediate, hidden]: gate rows, then up rows
    PackedLinear wdown;            // [hidden, intermediate]
  };

  // One thread's attention buffers: a KV head's keys and values gathered, a tile of scores.
  struct Scratch {
    std::vector<float> keys, values, scores;
  };
  struct AttentionTask {
    const ForwardSequence* seq = nullptr;
    int64_t row0 = 0;  // its first row in the batch
    int64_t kv_head = 0;
  };

  Status check(std::span<const ForwardSequence> batch, const PagedKvCache& cache) const;
  void attention(const ForwardSequence& seq, int64_t row0, int64_t layer, int64_t kv_head,
                 const PagedKvCache& cache, Scratch& scratch);

  LlamaConfig config_;
  std::function<void(int64_t)> on_layer_kv_;
  std::vector<float> embed_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;          // [hidden]
  std::unique_ptr<PackedLinear> lm_head_;  // [vocab, hidden] (embed_'s when tied)
  std::vector<float> rope_cos_;            // [max_position_embeddings, head_dim / 2]
  std::vector<float> rope_sin_;

  // Scratch, sized by the batch's tokens.
  std::vector<float> x_, h_, qkv_, attn_, gate_up_, act_, logits_rows_, logits_;
  std::vector<int64_t> positions_;
  std::vector<AttentionTask> tasks_;
  std::vector<Scratch> scratch_;  // per OpenMP thread
};

}  // namespace crescent::model
