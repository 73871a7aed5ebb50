// A linear layer's weight packed once for oneDNN's matmul (issue 11 §3): OpenBLAS's sgemm packs its B
// operand again on every call, which for a decode step's few rows costs more than the product itself (it
// reads a weight matrix at ~10 GB/s against ~30 GB/s for one read; docs/benchmarks.md). oneDNN's brgemm
// kernels read a layout chosen at construction, the same for any number of rows, so the weights are
// reordered into it once and each call only reads them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace crescent::model {

/// y[rows, out] = x[rows, in] × Wᵀ, W the [out, in] row-major weight of a linear layer; or y += that.
/// Thread-compatible (one call at a time), as LlamaForward runs.
class PackedLinear {
 public:
  /// Packs `weight` ([out, in], row-major); it is not used afterwards.
  PackedLinear(std::span<const float> weight, int64_t out, int64_t in);
  ~PackedLinear();
  PackedLinear(PackedLinear&&) noexcept;
  PackedLinear& operator=(PackedLinear&&) noexcept;

  /// x: rows × in floats, y: rows × out floats (row-major, contiguous); rows >= 1. `accumulate`: y += x Wᵀ.
  void apply(const float* x, int64_t rows, float* y, bool accumulate) const;
  int64_t out() const;
  int64_t in() const;
  /// Bytes of the packed weight.
  int64_t bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::model
