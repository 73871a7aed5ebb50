#include "serve/instance_wire.h"

#include <fmt/format.h>

#include <msgpack.hpp>

namespace crescent::serve {
namespace {

constexpr uint32_t kFields = 48;  // what encode packs, in order
constexpr uint8_t kLastKind = static_cast<uint8_t>(InstanceMessage::Kind::kPoolWritten);

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

}  // namespace

std::string_view to_string(InstanceRole role) {
  return role == InstanceRole::kPrefill ? "prefill" : "decode";
}

std::string encode(const InstanceMessage& m) {
  msgpack::sbuffer buffer;
  msgpack::packer pk(buffer);
  pk.pack_array(kFields);
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
  pk.pack_int64(m.first_token);
  pk.pack(m.tokens);
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
    if (o.type != msgpack::type::ARRAY || o.via.array.size != kFields) {
      return Status::invalid_argument(
          fmt::format("instance message: expected an array of {} fields", kFields));
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
    m.first_token = r.next<int64_t>();
    m.tokens = r.next<std::vector<int64_t>>();
  } catch (const std::exception& e) {
    return Status::invalid_argument(fmt::format("instance message: {}", e.what()));
  }
  return m;
}

}  // namespace crescent::serve
