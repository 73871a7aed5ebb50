#include "model/llama_forward.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "model/bf16.h"

namespace crescent::model {
namespace {

// Query rows per attention tile: bounds the scores matrix of a long prompt at kQueryTile × context floats.
constexpr int64_t kQueryTile = 256;

// The tensor `name` of `model` (checked by load_llama_model) as fp32.
std::vector<float> tensor_f32(const LlamaModel& model, const std::string& name) {
  const Tensor* t = model.weights.find(name);
  assert(t != nullptr);
  std::vector<float> out(static_cast<size_t>(t->elements()));
  if (t->dtype == DType::kF32) {
    std::memcpy(out.data(), t->data.data(), out.size() * sizeof(float));
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t half = 0;
      std::memcpy(&half, t->data.data() + 2 * i, 2);
      out[i] = from_bf16(half);
    }
  }
  return out;
}

std::vector<float> concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

// C[m, n] = alpha × A[m, k] × B[n, k]^T + beta × C (row-major): attention's scores, queries × keys^T. One
// row (a decode step's query) goes through sgemv, which streams B at the memory's bandwidth; sgemm would
// pack B first (docs/benchmarks.md).
void matmul_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b,
                static_cast<int>(ldb), a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}

// out[rows, d] = x / sqrt(mean(x²) + eps) × weight, row by row.
void rms_norm(const float* x, int64_t rows, int64_t d, const float* weight, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    double sum_squares = 0;
    for (int64_t i = 0; i < d; ++i) sum_squares += static_cast<double>(xr[i]) * xr[i];
    const auto scale = static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(d) + eps));
    float* o = out + r * d;
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * scale * weight[i];
  }
}

// HF's rotate-half rotary embedding of one head vector at one position: pairs (i, i + half).
void rotate(float* v, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i];
    const float b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i] + a * sin[i];
  }
}

void store_elements(const float* src, int64_t n, DType dtype, std::byte* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t half = to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &half, 2);
  }
}

void load_elements(const std::byte* src, int64_t n, DType dtype, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t half = 0;
    std::memcpy(&half, src + 2 * i, 2);
    dst[i] = from_bf16(half);
  }
}

}  // namespace

PagedKvCache::PagedKvCache(const KvBlockLayout& layout, int64_t capacity_blocks)
    : layout_(layout),
      capacity_blocks_(capacity_blocks),
      bytes_(static_cast<size_t>(capacity_blocks * layout.block_bytes())),
      buffer_(static_cast<std::byte*>(std::calloc(bytes_, 1))) {
  if (!buffer_) throw std::bad_alloc();
  free_.reserve(static_cast<size_t>(capacity_blocks));
  for (int64_t b = capacity_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> PagedKvCache::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t block = free_.back();
  free_.pop_back();
  return block;
}

void PagedKvCache::release(int32_t block) {
  assert(block >= 0 && block < capacity_blocks_);
  free_.push_back(block);
}

std::span<std::byte> PagedKvCache::block_bytes(int32_t block) {
  assert(block >= 0 && block < capacity_blocks_);
  const auto size = static_cast<size_t>(layout_.block_bytes());
  return {buffer_.get() + static_cast<size_t>(block) * size, size};
}

std::span<const std::byte> PagedKvCache::block_bytes(int32_t block) const {
  assert(block >= 0 && block < capacity_blocks_);
  const auto size = static_cast<size_t>(layout_.block_bytes());
  return {buffer_.get() + static_cast<size_t>(block) * size, size};
}

LlamaForward::LlamaForward(const LlamaModel& model) : config_(model.config) {
  // Attention's products are small and run on the OpenMP threads that share out the heads: OpenBLAS computes
  // each on its caller's thread (its own threads would spin against OpenMP's).
  openblas_set_num_threads(1);
  const LlamaConfig& c = config_;
  const int64_t d = c.hidden_size, hd = c.head_dim(), inter = c.intermediate_size;
  embed_ = tensor_f32(model, "model.embed_tokens.weight");
  layers_.reserve(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const auto q = tensor_f32(model, p + "self_attn.q_proj.weight");
    const auto k = tensor_f32(model, p + "self_attn.k_proj.weight");
    const auto v = tensor_f32(model, p + "self_attn.v_proj.weight");
    const auto gate = tensor_f32(model, p + "mlp.gate_proj.weight");
    const auto up = tensor_f32(model, p + "mlp.up_proj.weight");
    layers_.push_back(Layer{
        .attn_norm = tensor_f32(model, p + "input_layernorm.weight"),
        .wqkv =
            PackedLinear(concat({&q, &k, &v}), (c.num_attention_heads + 2 * c.num_key_value_heads) * hd, d),
        .wo = PackedLinear(tensor_f32(model, p + "self_attn.o_proj.weight"), d, c.num_attention_heads * hd),
        .mlp_norm = tensor_f32(model, p + "post_attention_layernorm.weight"),
        .wgate_up = PackedLinear(concat({&gate, &up}), 2 * inter, d),
        .wdown = PackedLinear(tensor_f32(model, p + "mlp.down_proj.weight"), d, inter)});
  }
  final_norm_ = tensor_f32(model, "model.norm.weight");
  lm_head_ = std::make_unique<PackedLinear>(
      c.tie_word_embeddings ? embed_ : tensor_f32(model, "lm_head.weight"), c.vocab_size, d);

  // cos/sin(position × theta^(-2i / head_dim)), i < head_dim / 2 (HF's LlamaRotaryEmbedding).
  const int64_t half = c.head_dim() / 2;
  rope_cos_.resize(static_cast<size_t>(c.max_position_embeddings * half));
  rope_sin_.resize(rope_cos_.size());
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim()));
    for (int64_t pos = 0; pos < c.max_position_embeddings; ++pos) {
      const double angle = static_cast<double>(pos) * inv_freq;
      rope_cos_[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::cos(angle));
      rope_sin_[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::sin(angle));
    }
  }
}

KvBlockLayout LlamaForward::kv_layout(int64_t block_size_tokens) const {
  return {.layers = config_.num_hidden_layers,
          .kv_heads = config_.num_key_value_heads,
          .head_dim = config_.head_dim(),
          .block_size_tokens = block_size_tokens,
          .dtype = config_.dtype};
}

double LlamaForward::prefill_flops(int64_t new_tokens, int64_t prefix_tokens) const {
  const LlamaConfig& c = config_;
  const auto d = static_cast<double>(c.hidden_size);
  const auto hd = static_cast<double>(c.head_dim());
  const auto heads = static_cast<double>(c.num_attention_heads);
  const auto kv = static_cast<double>(c.num_key_value_heads);
  const double per_token =
      d * (heads + 2 * kv) * hd + heads * hd * d + 3 * d * static_cast<double>(c.intermediate_size);
  const auto n = static_cast<double>(new_tokens);
  // Keys each new token attends to: prefix + its own position in the chunk, summed.
  const double attended = n * static_cast<double>(prefix_tokens) + n * (n + 1) / 2;
  const double attention = 2 * heads * hd * attended;  // QK^T and PV
  return 2 * (per_token * static_cast<double>(c.num_hidden_layers) * n +
              attention * static_cast<double>(c.num_hidden_layers) + d * static_cast<double>(c.vocab_size));
}

Status LlamaForward::check(std::span<const ForwardSequence> batch, const PagedKvCache& cache) const {
  const auto bad = [](const std::string& what) { return Status::invalid_argument(what); };
  if (batch.empty()) return bad("forward: empty batch");
  const KvBlockLayout& layout = cache.layout();
  if (layout != kv_layout(layout.block_size_tokens)) {
    return bad(fmt::format(
        "forward: the KV cache's blocks are for {} layers × {} KV heads × head dim {} ({}), the model's "
        "are {} × {} × {} ({})",
        layout.layers, layout.kv_heads, layout.head_dim, to_string(layout.dtype), config_.num_hidden_layers,
        config_.num_key_value_heads, config_.head_dim(), to_string(config_.dtype)));
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSequence& seq = batch[s];
    const auto n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0) return bad(fmt::format("forward: sequence {} has no tokens", s));
    if (seq.start_position < 0)
      return bad(fmt::format("forward: sequence {} starts at position {}", s, seq.start_position));
    const int64_t end = seq.start_position + n;
    if (end > config_.max_position_embeddings) {
      return bad(fmt::format("forward: sequence {} reaches position {}, the model's context is {} tokens", s,
                             end - 1, config_.max_position_embeddings));
    }
    for (int32_t t : seq.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return bad(fmt::format("forward: sequence {} has token id {}, the vocabulary has {}", s, t,
                               config_.vocab_size));
      }
    }
    const int64_t blocks = (end + layout.block_size_tokens - 1) / layout.block_size_tokens;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks) {
      return bad(fmt::format("forward: sequence {} needs {} KV blocks for {} tokens, its table has {}", s,
                             blocks, end, seq.block_table.size()));
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t block = seq.block_table[static_cast<size_t>(b)];
      if (block < 0 || block >= cache.capacity_blocks()) {
        return bad(fmt::format("forward: sequence {}'s block {} is {}, the cache has {}", s, b, block,
                               cache.capacity_blocks()));
      }
    }
  }
  return Status::ok_status();
}

Result<std::span<const float>> LlamaForward::forward(std::span<const ForwardSequence> batch,
                                                     PagedKvCache& cache) {
  CRESCENT_RETURN_IF_ERROR(check(batch, cache));
  const LlamaConfig& c = config_;
  const int64_t d = c.hidden_size;
  const int64_t hd = c.head_dim();
  const int64_t heads = c.num_attention_heads;
  const int64_t kv_heads = c.num_key_value_heads;
  const int64_t qkv_width = (heads + 2 * kv_heads) * hd;
  const int64_t inter = c.intermediate_size;
  const int64_t half = hd / 2;
  const KvBlockLayout& layout = cache.layout();
  const size_t element_bytes = dtype_bytes(layout.dtype);

  int64_t rows = 0;
  for (const ForwardSequence& seq : batch) rows += static_cast<int64_t>(seq.tokens.size());
  const auto size = [](int64_t n) { return static_cast<size_t>(n); };
  x_.resize(size(rows * d));
  h_.resize(size(rows * d));
  qkv_.resize(size(rows * qkv_width));
  attn_.resize(size(rows * heads * hd));
  gate_up_.resize(size(rows * 2 * inter));
  act_.resize(size(rows * inter));
  positions_.resize(size(rows));

  {
    int64_t r = 0;
    for (const ForwardSequence& seq : batch) {
      for (size_t i = 0; i < seq.tokens.size(); ++i, ++r) {
        positions_[size(r)] = seq.start_position + static_cast<int64_t>(i);
        std::memcpy(&x_[size(r * d)], &embed_[size(seq.tokens[i] * d)], size(d) * sizeof(float));
      }
    }
  }

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& layer = layers_[size(l)];
    rms_norm(x_.data(), rows, d, layer.attn_norm.data(), c.rms_norm_eps, h_.data());
    layer.wqkv.apply(h_.data(), rows, qkv_.data(), /*accumulate=*/false);

    // Rotate q and k, then write k and v to their blocks.
    int64_t r = 0;
    for (const ForwardSequence& seq : batch) {
      for (size_t i = 0; i < seq.tokens.size(); ++i, ++r) {
        const int64_t pos = positions_[size(r)];
        const float* cos = &rope_cos_[size(pos * half)];
        const float* sin = &rope_sin_[size(pos * half)];
        float* row = &qkv_[size(r * qkv_width)];
        for (int64_t head = 0; head < heads + kv_heads; ++head) rotate(row + head * hd, cos, sin, half);
        const int32_t block = seq.block_table[size(pos / layout.block_size_tokens)];
        const int64_t slot = pos % layout.block_size_tokens;
        std::byte* bytes = cache.block_bytes(block).data();
        for (int64_t j = 0; j < kv_heads; ++j) {
          store_elements(row + (heads + j) * hd, hd, layout.dtype,
                         bytes + size(layout.offset(l, 0, j, slot)) * element_bytes);
          store_elements(row + (heads + kv_heads + j) * hd, hd, layout.dtype,
                         bytes + size(layout.offset(l, 1, j, slot)) * element_bytes);
        }
      }
    }

    if (on_layer_kv_) on_layer_kv_(l);

    // Attention: each (sequence, KV head) is a task of its own, spread over the threads.
    tasks_.clear();
    r = 0;
    for (const ForwardSequence& seq : batch) {
      for (int64_t j = 0; j < kv_heads; ++j) tasks_.push_back({&seq, r, j});
      r += static_cast<int64_t>(seq.tokens.size());
    }
    scratch_.resize(static_cast<size_t>(omp_get_max_threads()));
    const auto task_count = static_cast<int64_t>(tasks_.size());
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < task_count; ++t) {
      const AttentionTask& task = tasks_[static_cast<size_t>(t)];
      attention(*task.seq, task.row0, l, task.kv_head, cache,
                scratch_[static_cast<size_t>(omp_get_thread_num())]);
    }
    layer.wo.apply(attn_.data(), rows, x_.data(), /*accumulate=*/true);

    rms_norm(x_.data(), rows, d, layer.mlp_norm.data(), c.rms_norm_eps, h_.data());
    layer.wgate_up.apply(h_.data(), rows, gate_up_.data(), /*accumulate=*/false);
    for (int64_t row = 0; row < rows; ++row) {
      const float* gate = &gate_up_[size(row * 2 * inter)];
      const float* up = gate + inter;
      float* out = &act_[size(row * inter)];
      for (int64_t i = 0; i < inter; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
    layer.wdown.apply(act_.data(), rows, x_.data(), /*accumulate=*/true);
  }

  // The final norm and the LM head, for the rows whose logits are wanted.
  int64_t logit_rows = 0;
  {
    int64_t r = 0;
    logits_rows_.clear();
    for (const ForwardSequence& seq : batch) {
      const auto n = static_cast<int64_t>(seq.tokens.size());
      const int64_t first = seq.logits == LogitsWanted::kAll ? 0 : n - 1;
      if (seq.logits != LogitsWanted::kNone) {
        for (int64_t i = first; i < n; ++i) {
          logits_rows_.insert(logits_rows_.end(), &x_[size((r + i) * d)], &x_[size((r + i + 1) * d)]);
          ++logit_rows;
        }
      }
      r += n;
    }
  }
  if (logit_rows == 0) return std::span<const float>{};
  rms_norm(logits_rows_.data(), logit_rows, d, final_norm_.data(), c.rms_norm_eps, logits_rows_.data());
  logits_.resize(size(logit_rows * c.vocab_size));
  lm_head_->apply(logits_rows_.data(), logit_rows, logits_.data(), /*accumulate=*/false);
  return std::span<const float>(logits_);
}

// Attention of `seq`'s new tokens (rows row0... of qkv_) in layer `layer`, into attn_: per KV head, its keys
// and values for every position are gathered from the blocks, then each query head of its group computes
// softmax(q k^T / sqrt(head_dim)) v over the positions up to its own, a tile of queries at a time.
void LlamaForward::attention(const ForwardSequence& seq, int64_t row0, int64_t layer, int64_t kv_head,
                             const PagedKvCache& cache, Scratch& scratch) {
  const LlamaConfig& c = config_;
  const int64_t hd = c.head_dim();
  const int64_t heads = c.num_attention_heads;
  const int64_t kv_heads = c.num_key_value_heads;
  const int64_t group = heads / kv_heads;
  const int64_t qkv_width = (heads + 2 * kv_heads) * hd;
  const KvBlockLayout& layout = cache.layout();
  const int64_t bs = layout.block_size_tokens;
  const size_t element_bytes = dtype_bytes(layout.dtype);
  const auto n = static_cast<int64_t>(seq.tokens.size());
  const int64_t start = seq.start_position;
  const int64_t context = start + n;
  const auto size = [](int64_t v) { return static_cast<size_t>(v); };
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

  std::vector<float>& keys_ = scratch.keys;
  std::vector<float>& values_ = scratch.values;
  std::vector<float>& scores_ = scratch.scores;
  keys_.resize(size(context * hd));
  values_.resize(size(context * hd));
  scores_.resize(size(std::min(n, kQueryTile) * context));
  {
    const int64_t j = kv_head;
    for (int64_t b = 0; b * bs < context; ++b) {
      const int64_t tokens = std::min(bs, context - b * bs);
      const std::byte* bytes = cache.block_bytes(seq.block_table[size(b)]).data();
      load_elements(bytes + size(layout.offset(layer, 0, j, 0)) * element_bytes, tokens * hd, layout.dtype,
                    &keys_[size(b * bs * hd)]);
      load_elements(bytes + size(layout.offset(layer, 1, j, 0)) * element_bytes, tokens * hd, layout.dtype,
                    &values_[size(b * bs * hd)]);
    }
    for (int64_t head = j * group; head < (j + 1) * group; ++head) {
      for (int64_t a = 0; a < n; a += kQueryTile) {
        const int64_t m = std::min(kQueryTile, n - a);
        const int64_t keys = start + a + m;  // the tile's last query sees them all
        const float* q = &qkv_[size((row0 + a) * qkv_width + head * hd)];
        matmul_bt(m, keys, hd, scale, q, qkv_width, keys_.data(), hd, 0, scores_.data(), keys);
        for (int64_t i = 0; i < m; ++i) {
          float* s = &scores_[size(i * keys)];
          const int64_t visible = start + a + i + 1;
          const float max = *std::max_element(s, s + visible);
          float sum = 0;
          for (int64_t k = 0; k < visible; ++k) {
            s[k] = std::exp(s[k] - max);
            sum += s[k];
          }
          const float inv = 1.0f / sum;
          for (int64_t k = 0; k < visible; ++k) s[k] *= inv;
          std::fill(s + visible, s + keys, 0.0f);
        }
        float* out = &attn_[size((row0 + a) * heads * hd + head * hd)];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(hd),
                    static_cast<int>(keys), 1, scores_.data(), static_cast<int>(keys), values_.data(),
                    static_cast<int>(hd), 0, out, static_cast<int>(heads * hd));
      }
    }
  }
}

}  // namespace crescent::model
