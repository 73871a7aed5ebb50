#include "model/packed_linear.h"

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

namespace crescent::model {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A primitive per row count (and accumulation); dropped all at once past this many (oneDNN's own primitive
// cache makes recreating one cheap), so prompts of ever new lengths do not grow it without bound.
constexpr size_t kMaxPrimitives = 128;

// Fewer rows than this are computed as this many (zero rows added): oneDNN 2.6's brgemm reads the packed
// weights ~25% slower for 1 or 2 rows than for 4 (a decode step of the small preset at batch 1: 26-27 ms
// against 21 ms padded; docs/benchmarks.md, "cpu executor"), and in a decode step the weight read is the
// cost, the extra rows' FLOPs are not.
constexpr int64_t kMinRows = 4;

}  // namespace

struct PackedLinear::Impl {
  int64_t out = 0, in = 0;
  dnnl::memory packed;
  dnnl::stream stream;
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory::desc weights;  // the layout it reads its weights in
  };
  mutable std::unordered_map<int64_t, Entry> primitives;  // key: rows × 2 + accumulate
  mutable std::vector<float> padded_x, padded_y;          // kMinRows rows, for calls with fewer

  dnnl::matmul::primitive_desc describe(int64_t rows, bool accumulate) const {
    const dnnl::memory::desc src({rows, in}, dt::f32, tag::ab);
    const dnnl::memory::desc weights({in, out}, dt::f32, tag::any);
    const dnnl::memory::desc dst({rows, out}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpu_engine());
  }
};

PackedLinear::PackedLinear(std::span<const float> weight, int64_t out, int64_t in)
    : impl_(std::make_unique<Impl>()) {
  impl_->out = out;
  impl_->in = in;
  impl_->stream = dnnl::stream(cpu_engine());
  // The layout oneDNN picks for one row is the one it picks for any (checked for the presets' shapes from
  // 1 to 16,384 rows); apply() reorders for a row count that would want another.
  const dnnl::matmul::primitive_desc pd = impl_->describe(1, false);
  // W is [out, in] row-major: as the matmul's [in, out] weights it is the transposed layout "ba".
  dnnl::memory plain({{in, out}, dt::f32, tag::ba}, cpu_engine(), const_cast<float*>(weight.data()));
  impl_->packed = dnnl::memory(pd.weights_desc(), cpu_engine());
  dnnl::reorder(plain, impl_->packed).execute(impl_->stream, plain, impl_->packed);
  impl_->stream.wait();
}

PackedLinear::~PackedLinear() = default;
PackedLinear::PackedLinear(PackedLinear&&) noexcept = default;
PackedLinear& PackedLinear::operator=(PackedLinear&&) noexcept = default;

void PackedLinear::apply(const float* x, int64_t rows, float* y, bool accumulate) const {
  Impl& m = *impl_;
  if (rows < kMinRows) {
    m.padded_x.assign(static_cast<size_t>(kMinRows * m.in), 0.0f);
    std::copy(x, x + rows * m.in, m.padded_x.begin());
    m.padded_y.assign(static_cast<size_t>(kMinRows * m.out), 0.0f);
    if (accumulate) std::copy(y, y + rows * m.out, m.padded_y.begin());
    apply(m.padded_x.data(), kMinRows, m.padded_y.data(), accumulate);
    std::copy(m.padded_y.begin(), m.padded_y.begin() + rows * m.out, y);
    return;
  }
  const int64_t key = rows * 2 + (accumulate ? 1 : 0);
  auto it = m.primitives.find(key);
  if (it == m.primitives.end()) {
    if (m.primitives.size() >= kMaxPrimitives) m.primitives.clear();
    const dnnl::matmul::primitive_desc pd = m.describe(rows, accumulate);
    it = m.primitives.emplace(key, Impl::Entry{dnnl::matmul(pd), pd.weights_desc()}).first;
  }
  const Impl::Entry& entry = it->second;
  // The packed layout is the one oneDNN wants for any row count at the shapes seen so far; should it want
  // another, the weights are reordered into it for this call (correct, slower).
  dnnl::memory weights = m.packed;
  if (entry.weights != m.packed.get_desc()) {
    weights = dnnl::memory(entry.weights, cpu_engine());
    dnnl::reorder(m.packed, weights).execute(m.stream, m.packed, weights);
  }
  dnnl::memory src({{rows, m.in}, dt::f32, tag::ab}, cpu_engine(), const_cast<float*>(x));
  dnnl::memory dst({{rows, m.out}, dt::f32, tag::ab}, cpu_engine(), y);
  entry.primitive.execute(m.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
  m.stream.wait();
}

int64_t PackedLinear::out() const {
  return impl_->out;
}
int64_t PackedLinear::in() const {
  return impl_->in;
}
int64_t PackedLinear::bytes() const {
  return static_cast<int64_t>(impl_->packed.get_desc().get_size());
}

}  // namespace crescent::model
