// Analytic prefill, decode, transfer and capacity model of one instance serving one model (paper §2.2).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "perf/hardware_spec.h"
#include "perf/model_spec.h"
#include "perf/profile.h"

namespace crescent::perf {

/// Times and sizes for one model on one instance. Every query is pure and allocation-free, a few multiplies
/// on constants precomputed by the constructor (the scheduler calls them in its inner loop); hot ones are
/// inline. Immutable after construction, so safe to share between threads.
class CostModel {
 public:
  /// REQUIRES: validate_model_spec(model) and validate_hardware_spec(hardware) are ok (asserted in debug).
  /// With `profile` (crescent profile), its measured coefficients replace the roofline's for compute and
  /// decode times; KV sizes, capacities and the links still come from the model and hardware.
  CostModel(ModelSpec model, HardwareSpec hardware, const Profile* profile = nullptr);

  const ModelSpec& model() const { return model_; }
  const HardwareSpec& hardware() const { return hardware_; }

  /// KV cache bytes of one token, all layers (paper §2.2):
  ///   layers * 2 (K and V) * hidden_size / gqa * bytes_per_element,  gqa = attention_heads / kv_heads.
  /// llama3-70b in bf16: 327,680 B.
  double kv_bytes_per_token() const { return kv_bytes_per_token_; }

  /// Bytes of the weights: parameters * bytes_per_element.
  double weight_bytes() const { return weight_bytes_; }

  /// FLOPs to prefill `new_tokens` (n) tokens after a reused prefix of `prefix_tokens` (p) tokens:
  ///   2 * parameters * n  +  4 * layers * hidden_size * n * (p + (n + 1) / 2).
  /// First term: the linear layers, the standard 2 FLOPs (multiply, add) per weight per token, counting every
  /// weight. Second: causal attention, QK^T and AV each 2 * ctx * hidden_size FLOPs per layer for a token
  /// attending to ctx tokens; the new tokens attend to p + (n + 1) / 2 tokens on average.
  /// Paper Eq. 1, flops(n) = l * (a*n^2*d + b*n*d^2), is the p = 0 case plus a 2*l*d*n diagonal term, with
  ///   a = 2 (causal; Table 1's a = 4 counts the full n x n score matrix),
  ///   b = 2 * parameters / (l * d^2) (26.3 for llama3-70b; Table 1: 22).
  /// A reused prefix saves exactly Eq. 1's l*(a*p^2*d + b*p*d^2) + 2*l*d*p, for any n >= p:
  ///   prefill_flops(n, 0) - prefill_flops(n - p, p) == prefill_flops(p, 0).
  /// REQUIRES: new_tokens >= 0, prefix_tokens >= 0.
  double prefill_flops(int64_t new_tokens, int64_t prefix_tokens) const {
    assert(new_tokens >= 0 && prefix_tokens >= 0);
    const double n = static_cast<double>(new_tokens);
    const double attended = attended_tokens(n, prefix_tokens);
    return n * (linear_flops_per_token_ + attention_flops_per_token_context_ * attended);
  }

  /// Seconds to prefill: prefill_flops / (gpus * peak_flops_per_gpu * mfu); 0 when new_tokens == 0.
  /// REQUIRES: new_tokens >= 0, prefix_tokens >= 0.
  double prefill_time_s(int64_t new_tokens, int64_t prefix_tokens) const {
    assert(new_tokens >= 0 && prefix_tokens >= 0);
    const double n = static_cast<double>(new_tokens);
    return n * (c_.linear_s_per_token + c_.attention_s_per_token_context * attended_tokens(n, prefix_tokens));
  }

  /// Seconds of one continuous-batching decode iteration (paper §2.1) producing one token for each of
  /// `batch_requests` requests whose KV caches hold `context_tokens` tokens in total. Roofline: the larger of
  ///   memory:  (weight_bytes + context_tokens * kv_bytes_per_token)
  ///            / (gpus * hbm_bytes_per_s_per_gpu * memory_bandwidth_utilization)   (weights read once)
  ///   compute: (2 * parameters * batch_requests + 4 * layers * hidden_size * context_tokens)
  ///            / (gpus * peak_flops_per_gpu * mfu).
  /// A profile's memory term adds decode_s_per_request per request.
  /// 0 when batch_requests == 0. REQUIRES: batch_requests >= 0, context_tokens >= 0.
  double decode_step_time_s(int64_t batch_requests, int64_t context_tokens) const {
    return decode_step_cost().time_s(batch_requests, context_tokens);
  }
  /// decode_step_time_s's coefficients by value: a loop over hundreds of decode instances keeps them in
  /// registers, where a reference's would be read again after every store of a double.
  struct DecodeStepCost {
    double weight_read_s, s_per_request, kv_read_s_per_token, linear_s_per_token,
        attention_s_per_token_context;
    /// decode_step_time_s(batch_requests, context_tokens).
    double time_s(int64_t batch_requests, int64_t context_tokens) const {
      assert(batch_requests >= 0 && context_tokens >= 0);
      if (batch_requests == 0) return 0;
      return busy_time_s(static_cast<double>(batch_requests), static_cast<double>(context_tokens));
    }
    /// time_s of a batch of at least one request, the counts as doubles (exact below 2^53): without
    /// time_s's branch, so a loop over many instances' counts runs two at a time. REQUIRES:
    /// batch_requests >= 1.
    double busy_time_s(double batch_requests, double context_tokens) const {
      const double memory_s =
          weight_read_s + batch_requests * s_per_request + context_tokens * kv_read_s_per_token;
      const double compute_s =
          batch_requests * linear_s_per_token + context_tokens * attention_s_per_token_context;
      return memory_s < compute_s ? compute_s : memory_s;  // std::max, in a form that vectorizes
    }
  };
  /// This model's DecodeStepCost.
  DecodeStepCost decode_step_cost() const {
    return {c_.decode_weight_read_s, c_.decode_s_per_request, c_.decode_kv_read_s_per_token,
            c_.linear_s_per_token, c_.attention_s_per_token_context};
  }

  /// Seconds of one engine iteration of a colocated instance (vLLM-style, paper §5.1) that decodes one token
  /// for each of `decode_requests` requests holding `decode_context_tokens` KV tokens in total AND prefills
  /// `prefill_tokens` new tokens after a cached prefix of `prefill_prefix_tokens`. Roofline over the whole
  /// iteration, the larger of
  ///   memory:  (weight_bytes + (decode_context_tokens + prefill_prefix_tokens) * kv_bytes_per_token)
  ///            / (gpus * hbm_bytes_per_s_per_gpu * memory_bandwidth_utilization)   (weights read once)
  ///   compute: decode_step_time_s's compute FLOPs + prefill_flops(prefill_tokens, prefill_prefix_tokens),
  ///            over gpus * peak_flops_per_gpu * mfu.
  /// Equals decode_step_time_s(decode_requests, decode_context_tokens) when prefill_tokens == 0. With
  /// decode_requests == 0 it is >= prefill_time_s(prefill_tokens, prefill_prefix_tokens), and equal for
  /// realistic sizes: a pure prefill of 512+ tokens is compute-bound (llama3-70b on 8xA800: 58 ms of compute
  /// for 512 tokens, 12 ms of weight reads). A prefix without prefill tokens reads nothing. 0 when there is
  /// nothing to do. A profile's decode_s_per_request applies as in decode_step_time_s, and an iteration
  /// that prefills costs its prefill_iteration_overhead_s on top.
  /// REQUIRES: all arguments >= 0.
  double iteration_time_s(int64_t decode_requests, int64_t decode_context_tokens, int64_t prefill_tokens,
                          int64_t prefill_prefix_tokens) const {
    return iteration_time_s(c_, decode_requests, decode_context_tokens, prefill_tokens,
                            prefill_prefix_tokens);
  }
  /// iteration_time_s with coefficients `c` (what a fitted profile predicts before a CostModel is built).
  static double iteration_time_s(const Profile& c, int64_t decode_requests, int64_t decode_context_tokens,
                                 int64_t prefill_tokens, int64_t prefill_prefix_tokens) {
    assert(decode_requests >= 0 && decode_context_tokens >= 0 && prefill_tokens >= 0 &&
           prefill_prefix_tokens >= 0);
    if (decode_requests == 0 && prefill_tokens == 0) return 0;
    const double ctx = static_cast<double>(decode_context_tokens);
    const double prefix = prefill_tokens > 0 ? static_cast<double>(prefill_prefix_tokens) : 0.0;
    const double batch = static_cast<double>(decode_requests);
    const double n = static_cast<double>(prefill_tokens);
    const double memory_s = c.decode_weight_read_s + batch * c.decode_s_per_request +
                            (ctx + prefix) * c.decode_kv_read_s_per_token;
    const double compute_s = batch * c.linear_s_per_token + ctx * c.attention_s_per_token_context +
                             n * (c.linear_s_per_token + c.attention_s_per_token_context *
                                                             attended_tokens(n, prefill_prefix_tokens));
    return std::max(memory_s, compute_s) + (prefill_tokens > 0 ? c.prefill_iteration_overhead_s : 0.0);
  }
  /// The coefficients in use: the roofline's (source "roofline") or the profile's.
  const Profile& coefficients() const { return c_; }

  /// Seconds a prefill instance takes to compute `new_tokens` after a cached prefix of `prefix_tokens`, in
  /// iterations of at most `chunk_tokens` (0: one iteration) that do nothing else: the sum of
  /// iteration_time_s(0, 0, chunk, prefix + tokens before it). Equals prefill_time_s when every iteration is
  /// compute-bound (the chunks' FLOPs add up to the whole prompt's, Eq. 1); each iteration also reads the
  /// weights once. REQUIRES: new_tokens >= 0, prefix_tokens >= 0, chunk_tokens >= 0.
  double prefill_iterations_time_s(int64_t new_tokens, int64_t prefix_tokens, int64_t chunk_tokens) const {
    assert(new_tokens >= 0 && prefix_tokens >= 0 && chunk_tokens >= 0);
    if (chunk_tokens == 0 || new_tokens <= chunk_tokens)
      return iteration_time_s(0, 0, new_tokens, prefix_tokens);
    double total_s = 0;
    for (int64_t done = 0; done < new_tokens; done += chunk_tokens) {
      total_s += iteration_time_s(0, 0, std::min(chunk_tokens, new_tokens - done), prefix_tokens + done);
    }
    return total_s;
  }

  /// Seconds to move `bytes` at `bytes_per_s`: bytes / bytes_per_s. REQUIRES: bytes_per_s > 0.
  static double transfer_time_s(double bytes, double bytes_per_s) { return bytes / bytes_per_s; }

  /// Seconds to move the KV cache of `tokens` tokens between instances over network_bytes_per_s (paper §3.2).
  double kv_transfer_time_s(int64_t tokens) const {
    return static_cast<double>(tokens) * kv_transfer_s_per_token_;
  }

  /// When a prompt's KV has all reached its decode instance (paper §3.1 step 3): its KV streams chunk by
  /// chunk (`chunk_tokens`) while the prefill runs, and within the last chunk layer by layer: each of the
  /// model's L layers' share of the chunk's KV (T / L, T = kv_transfer_time_s(last chunk)) leaves once the
  /// chunk's iteration has computed that layer (after t / L each, t = that iteration's time), one after the
  /// other on the link. So after the prefill ends at `done_s` one layer's share is left to send when the
  /// link keeps up (T <= t), and otherwise what the link has not caught up: done_s + max(T / L, T - t (L-1) / L).
  /// The whole prompt's KV (`input_tokens`, reused prefix included, which is in DRAM from the start) cannot
  /// arrive faster than the link allows from the prefill's start `start_s` either:
  ///   max(done_s + max(T / L, T - t (L - 1) / L),  start_s + kv_transfer_time_s(input_tokens)).
  /// With L = 1 that is chunk-by-chunk streaming. REQUIRES: chunk_tokens >= 1,
  /// 1 <= prefill_tokens <= input_tokens.
  double kv_handoff_done_s(int64_t input_tokens, int64_t prefill_tokens, int64_t chunk_tokens, double start_s,
                           double done_s) const {
    assert(chunk_tokens >= 1 && prefill_tokens >= 1 && prefill_tokens <= input_tokens);
    const int64_t last_chunk_tokens =
        prefill_tokens % chunk_tokens == 0 ? chunk_tokens : prefill_tokens % chunk_tokens;
    const double layers = static_cast<double>(std::max<int64_t>(1, model_.layers));
    const double transfer_s = kv_transfer_time_s(last_chunk_tokens);
    const double compute_s = iteration_time_s(0, 0, last_chunk_tokens, input_tokens - last_chunk_tokens);
    const double exposed_s = std::max(transfer_s / layers, transfer_s - compute_s * (layers - 1) / layers);
    return std::max(done_s + exposed_s, start_s + kv_transfer_time_s(input_tokens));
  }

  /// Seconds to load the KV cache of `tokens` tokens from host DRAM into HBM over host_device_bytes_per_s.
  double kv_load_time_s(int64_t tokens) const { return static_cast<double>(tokens) * kv_load_s_per_token_; }

  /// KV tokens that fit in the instance's HBM besides the weights, keeping `reserved_share` of HBM for
  /// activations and fragmentation: floor((gpus * hbm_bytes_per_gpu * (1 - reserved_share) - weight_bytes)
  /// / kv_bytes_per_token), 0 when the weights do not fit. REQUIRES: 0 <= reserved_share < 1.
  int64_t decode_kv_capacity_tokens(double reserved_share = 0.1) const;

  /// Whether the times this model predicts are finite for work of up to `max_tokens` tokens: its
  /// coefficients, then a prefill of that many tokens after as long a prefix in iterations of `chunk_tokens`
  /// (0: one), a decode step of that many requests over that many tokens, that many tokens' KV moved and
  /// loaded. Times grow with tokens, so these bound every smaller size. Figures that pass validation alone
  /// can still overflow (a bandwidth of 1e-300 bytes/s, a profile's coefficient of 1e300 s), and an infinite
  /// time cannot be scheduled. Error (kInvalidArgument): `where`, which coefficient or time, and the figures
  /// it comes from.
  Status check_times_finite(int64_t max_tokens, int64_t chunk_tokens, std::string_view where) const;

 private:
  // Average number of tokens a new token attends to under causal masking: p + (n + 1) / 2.
  static double attended_tokens(double n, int64_t prefix_tokens) {
    return static_cast<double>(prefix_tokens) + (n + 1) * 0.5;
  }

  ModelSpec model_;
  HardwareSpec hardware_;
  double kv_bytes_per_token_;
  double weight_bytes_;
  double linear_flops_per_token_;             // 2 * parameters
  double attention_flops_per_token_context_;  // 4 * layers * hidden_size
  // Divisions done once: the two above over gpus * peak_flops_per_gpu * mfu (linear, attention); weight and
  // KV bytes over gpus * hbm_bytes_per_s_per_gpu * memory_bandwidth_utilization (decode reads), or a
  // profile's measured values; KV bytes over the two links.
  Profile c_;
  double kv_transfer_s_per_token_;
  double kv_load_s_per_token_;
};

}  // namespace crescent::perf
