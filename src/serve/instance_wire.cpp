#include "serve/instance_wire.h"

#include <fmt/format.h>

#include <msgpack.hpp>

namespace crescent::serve {
namespace {

constexpr uint32_t kFields = 50;  // what encode packs, in order
// The optional tail of a message with logprobs: top_logprobs, logprob_rows, then the logprobs flat (each
// sampled token's, each entry's count of alternatives, their token ids, their logprobs), as the unpacker
// reads no deeper than arrays of scalars.
constexpr uint32_t kLogprobFields = 6;
constexpr uint8_t kLastKind = static_cast<uint8_t>(InstanceMessage::Kind::kRoomFree);

template <typename Packer>
void pack_group(Packer& pk, const kv::DecodeGroup& g) {
  pk.pack_int64(g.requests);
  pk.pack_int64(g.context_tokens);
  pk.pack_int64(g.kv_tokens);
}

// Reads the fields in order; throws msgpack::type_error on a wrong type.
class Reader {
 public:
  explicit Reader(const msgpack::object_array& a) : a_(a) {}
  template <typename T>
  T next() {
    return a_.ptr[i_++].as<T>();
  }
  void group(kv::DecodeGroup& g) {
    g.requests = next<int64_t>();
    g.context_tokens = next<int64_t>();
    g.kv_tokens = next<int64_t>();
  }

 private:
  const msgpack::object_array& a_;
  uint32_t i_ = 0;
};

// Checks the logprobs tail of `m` and unflattens it into m.logprobs.
Status read_logprobs(InstanceMessage& m, const std::vector<float>& sampled,
                     const std::vector<uint32_t>& counts, const std::vector<int32_t>& top_ids,
                     const std::vector<float>& top_values) {
  const auto bad = [](const std::string& what) {
    return Status::invalid_argument(fmt::format("instance message: logprobs: {}", what));
  };
  if (m.top_logprobs < model::kNoLogprobs || m.top_logprobs > model::kMaxTopLogprobs) {
    return bad(fmt::format("top_logprobs {}", m.top_logprobs));
  }
  if (counts.size() != sampled.size() || top_ids.size() != top_values.size()) {
    return bad("parts of different lengths");
  }
  if (!m.logprob_rows.empty() && m.logprob_rows.size() != sampled.size()) {
    return bad(fmt::format("{} rows for {} tokens", m.logprob_rows.size(), sampled.size()));
  }
  for (size_t j = 0; j < m.logprob_rows.size(); ++j) {
    if (m.logprob_rows[j] >= m.request_ids.size() || (j > 0 && m.logprob_rows[j] <= m.logprob_rows[j - 1])) {
      return bad("rows not increasing within request_ids");
    }
  }
  size_t next = 0;
  m.logprobs.resize(sampled.size());
  for (size_t j = 0; j < sampled.size(); ++j) {
    if (counts[j] > static_cast<uint32_t>(model::kMaxTopLogprobs) || counts[j] > top_ids.size() - next) {
      return bad(fmt::format("{} alternatives", counts[j]));
    }
    model::TokenLogprobs& lp = m.logprobs[j];
    lp.logprob = sampled[j];
    lp.top.reserve(counts[j]);
    for (uint32_t k = 0; k < counts[j]; ++k, ++next) lp.top.emplace_back(top_ids[next], top_values[next]);
  }
  if (next != top_ids.size()) return bad("alternatives beyond the counts");
  return Status();
}

}  // namespace

std::string_view to_string(InstanceRole role) {
  return role == InstanceRole::kPrefill ? "prefill" : "decode";
}

std::string encode(const InstanceMessage& m) {
  msgpack::sbuffer buffer;
  msgpack::packer pk(buffer);
  const bool has_logprobs = m.top_logprobs != model::kNoLogprobs || !m.logprobs.empty();
  pk.pack_array(has_logprobs ? kFields + kLogprobFields : kFields);
  pk.pack_uint8(static_cast<uint8_t>(m.kind));
  pk.pack_uint64(m.request_id);
  pk.pack_uint8(static_cast<uint8_t>(m.role));
  pk.pack_uint32(m.index);
  pk.pack_uint64(m.incarnation);
  pk.pack(m.kv_events_endpoint);
  pk.pack(m.kv_replay_endpoint);
  pk.pack_int64(m.kv_capacity_tokens);
  pack_group(pk, m.load.running);  // 3 fields each
  pack_group(pk, m.load.waiting);
  pack_group(pk, m.load.incoming);
  pk.pack_int64(m.load.kv_capacity_tokens);
  pk.pack_int64(m.outstanding);
  pk.pack(m.token_ids);
  pk.pack_int64(m.input_tokens);
  pk.pack_int64(m.output_tokens);
  pk.pack_int64(m.reused_tokens);
  pk.pack_int64(m.fetched_tokens);
  pk.pack_double(m.ready_in_s);
  pk.pack_uint32(m.decode_index);
  pk.pack_int64(m.hit_tokens);
  pk.pack_int64(m.pool_hit_tokens);
  pk.pack_int64(m.fetched_tokens_expected);
  pk.pack_int64(m.computed_tokens);
  pk.pack_uint64(m.kv_bytes);
  pk.pack_uint64(m.kv_chunks);
  pk.pack(m.kv_transport);
  pk.pack_uint64(m.pool_read_bytes);
  pk.pack_uint64(m.pool_write_bytes);
  pk.pack_uint64(m.blocks_verified);
  pk.pack_uint64(m.checksum_failures);
  pk.pack(m.segment);
  pk.pack_uint64(m.offset_bytes);
  pk.pack_uint64(m.length_bytes);
  pk.pack(m.request_ids);
  pk.pack(m.block_keys);
  pk.pack(m.error);
  pk.pack_uint64(m.seed);
  pk.pack_double(m.temperature);
  pk.pack_double(m.top_p);
  pk.pack_int64(m.output_offset);
  pk.pack_int64(m.first_token);
  pk.pack(m.tokens);
  pk.pack(m.draining);
  if (has_logprobs) {
    pk.pack_int32(m.top_logprobs);
    pk.pack(m.logprob_rows);
    std::vector<float> sampled, top_values;
    std::vector<uint32_t> counts;
    std::vector<int32_t> top_ids;
    sampled.reserve(m.logprobs.size());
    counts.reserve(m.logprobs.size());
    for (const model::TokenLogprobs& lp : m.logprobs) {
      sampled.push_back(lp.logprob);
      counts.push_back(static_cast<uint32_t>(lp.top.size()));
      for (const auto& [id, value] : lp.top) {
        top_ids.push_back(id);
        top_values.push_back(value);
      }
    }
    pk.pack(sampled);
    pk.pack(counts);
    pk.pack(top_ids);
    pk.pack(top_values);
  }
  return std::string(buffer.data(), buffer.size());
}

Result<InstanceMessage> decode_instance_message(std::string_view bytes) {
  InstanceMessage m;
  try {
    // Bounded: a hostile or corrupt message cannot make the unpacker allocate without limit.
    const msgpack::unpack_limit limit(/*array=*/1u << 24, /*map=*/0, /*str=*/1u << 16, /*bin=*/0, /*ext=*/0,
                                      /*depth=*/2);
    const msgpack::object_handle handle =
        msgpack::unpack(bytes.data(), bytes.size(), nullptr, nullptr, limit);
    const msgpack::object& o = handle.get();
    if (o.type != msgpack::type::ARRAY ||
        (o.via.array.size != kFields && o.via.array.size != kFields + kLogprobFields)) {
      return Status::invalid_argument(
          fmt::format("instance message: expected an array of {} fields ({} with "
                      "logprobs)",
                      kFields, kFields + kLogprobFields));
    }
    Reader r(o.via.array);
    const auto kind = r.next<uint8_t>();
    if (kind > kLastKind)
      return Status::invalid_argument(fmt::format("instance message: unknown kind {}", kind));
    m.kind = static_cast<InstanceMessage::Kind>(kind);
    m.request_id = r.next<uint64_t>();
    const auto role = r.next<uint8_t>();
    if (role > 1) return Status::invalid_argument(fmt::format("instance message: unknown role {}", role));
    m.role = static_cast<InstanceRole>(role);
    m.index = r.next<uint32_t>();
    m.incarnation = r.next<uint64_t>();
    m.kv_events_endpoint = r.next<std::string>();
    m.kv_replay_endpoint = r.next<std::string>();
    m.kv_capacity_tokens = r.next<int64_t>();
    r.group(m.load.running);
    r.group(m.load.waiting);
    r.group(m.load.incoming);
    m.load.kv_capacity_tokens = r.next<int64_t>();
    m.outstanding = r.next<int64_t>();
    m.token_ids = r.next<std::vector<int64_t>>();
    m.input_tokens = r.next<int64_t>();
    m.output_tokens = r.next<int64_t>();
    m.reused_tokens = r.next<int64_t>();
    m.fetched_tokens = r.next<int64_t>();
    m.ready_in_s = r.next<double>();
    m.decode_index = r.next<uint32_t>();
    m.hit_tokens = r.next<int64_t>();
    m.pool_hit_tokens = r.next<int64_t>();
    m.fetched_tokens_expected = r.next<int64_t>();
    m.computed_tokens = r.next<int64_t>();
    m.kv_bytes = r.next<uint64_t>();
    m.kv_chunks = r.next<uint64_t>();
    m.kv_transport = r.next<std::string>();
    m.pool_read_bytes = r.next<uint64_t>();
    m.pool_write_bytes = r.next<uint64_t>();
    m.blocks_verified = r.next<uint64_t>();
    m.checksum_failures = r.next<uint64_t>();
    m.segment = r.next<std::string>();
    m.offset_bytes = r.next<uint64_t>();
    m.length_bytes = r.next<uint64_t>();
    m.request_ids = r.next<std::vector<uint64_t>>();
    m.block_keys = r.next<std::vector<uint64_t>>();
    m.error = r.next<std::string>();
    m.seed = r.next<uint64_t>();
    m.temperature = r.next<double>();
    m.top_p = r.next<double>();
    m.output_offset = r.next<int64_t>();
    m.first_token = r.next<int64_t>();
    m.tokens = r.next<std::vector<int64_t>>();
    m.draining = r.next<bool>();
    if (o.via.array.size == kFields + kLogprobFields) {
      m.top_logprobs = r.next<int32_t>();
      m.logprob_rows = r.next<std::vector<uint32_t>>();
      const auto sampled = r.next<std::vector<float>>();
      const auto counts = r.next<std::vector<uint32_t>>();
      const auto top_ids = r.next<std::vector<int32_t>>();
      const auto top_values = r.next<std::vector<float>>();
      if (Status s = read_logprobs(m, sampled, counts, top_ids, top_values); !s.ok()) return s;
    }
  } catch (const std::exception& e) {
    return Status::invalid_argument(fmt::format("instance message: {}", e.what()));
  }
  return m;
}

}  // namespace crescent::serve
