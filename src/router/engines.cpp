#include "router/engines.h"

#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>
#include <set>

#include "common/json_util.h"
#include "common/name_table.h"

namespace crescent::router {

namespace {

constexpr NameTable<EngineRole, 3> kRoles{"engine role",
                                          {{
                                              {"prefill", EngineRole::kPrefill},
                                              {"decode", EngineRole::kDecode},
                                              {"both", EngineRole::kBoth},
                                          }}};

}  // namespace

std::string_view to_string(EngineRole role) {
  return kRoles.name(role);
}

Result<HostPort> parse_host_port(std::string_view url, std::string_view scheme, std::string_view what) {
  const auto bad = [&](std::string_view why) {
    return Status::invalid_argument(
        fmt::format("{} '{}' is not {}://HOST:PORT ({})", what, url, scheme, why));
  };
  const std::string prefix = fmt::format("{}://", scheme);
  if (!url.starts_with(prefix)) return bad(fmt::format("it does not start with {}", prefix));
  std::string_view rest = url.substr(prefix.size());
  while (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) return bad("it has a path");
  std::string_view host, port_text;
  if (rest.starts_with('[')) {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return bad("no port");
    host = rest.substr(1, close - 1);
    port_text = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
  }
  if (host.empty() || host == "*") return bad("no host");
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 || port > 65535)
    return bad(fmt::format("port '{}' is not 1..65535", port_text));
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

Result<EngineEntry> engine_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Status::invalid_argument(fmt::format("{}: an engine must be a JSON object", where));
  EngineEntry e;
  // The name first, so every later error can say which engine it is.
  std::string named = where;
  if (auto it = j.find("name"); it != j.end() && it->is_string()) {
    named = fmt::format("{} ('{}')", where, it->get<std::string>());
  }
  JsonFields f(j, named);
  CRESCENT_RETURN_IF_ERROR(
      f.no_unknown_keys({"name", "url", "role", "model", "block_size", "kv_events", "kv_replay", "profile",
                         "cache_blocks", "kv_capacity_tokens", "token_ids", "api_key_file", "kv_pool"}));
  CRESCENT_RETURN_IF_ERROR(f.no_missing_keys({"name", "url", "role", "model", "block_size"}));
  CRESCENT_RETURN_IF_ERROR(f.string("name", e.name));
  if (e.name.empty()) return Status::invalid_argument(fmt::format("{}: field 'name' is empty", named));
  CRESCENT_RETURN_IF_ERROR(f.string("url", e.url));
  while (e.url.ends_with('/')) e.url.pop_back();
  auto http = parse_host_port(e.url, "http", fmt::format("{}: field 'url'", named));
  if (!http.ok()) return http.status();
  std::string role;
  CRESCENT_RETURN_IF_ERROR(f.string("role", role));
  auto parsed_role = kRoles.parse(role);
  if (!parsed_role.ok()) {
    return Status::invalid_argument(fmt::format("{}: field 'role': {}", named, parsed_role.status().message()));
  }
  e.role = *parsed_role;
  CRESCENT_RETURN_IF_ERROR(f.string("model", e.model));
  if (e.model.empty()) return Status::invalid_argument(fmt::format("{}: field 'model' is empty", named));
  CRESCENT_RETURN_IF_ERROR(f.integer("block_size", e.block_size_tokens, 1));
  CRESCENT_RETURN_IF_ERROR(f.string("kv_events", e.kv_events, false));
  CRESCENT_RETURN_IF_ERROR(f.string("kv_replay", e.kv_replay, false));
  for (const auto& [field, endpoint] : {std::pair{"kv_events", &e.kv_events}, {"kv_replay", &e.kv_replay}}) {
    if (endpoint->empty()) continue;
    auto tcp = parse_host_port(*endpoint, "tcp", fmt::format("{}: field '{}'", named, field));
    if (!tcp.ok()) return tcp.status();
    if (tcp->host != http->host) {
      // The events of an engine come from the engine: an endpoint elsewhere could speak for it.
      return Status::invalid_argument(fmt::format(
          "{}: field '{}': host '{}' is not the url's host '{}' (an engine's KV events come from the engine "
          "itself)",
          named, field, tcp->host, http->host));
    }
  }
  if (!e.kv_replay.empty() && e.kv_events.empty()) {
    return Status::invalid_argument(fmt::format("{}: field 'kv_replay' is given without 'kv_events'", named));
  }
  CRESCENT_RETURN_IF_ERROR(f.string("profile", e.profile_path, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("cache_blocks", e.cache_blocks, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("kv_capacity_tokens", e.kv_capacity_tokens, 1, false));
  if (auto it = j.find("token_ids"); it != j.end()) {
    if (!it->is_boolean())
      return Status::invalid_argument(fmt::format("{}: field 'token_ids' must be true or false", named));
    e.token_ids = it->get<bool>();
  }
  CRESCENT_RETURN_IF_ERROR(f.string("api_key_file", e.api_key_file, false));
  CRESCENT_RETURN_IF_ERROR(f.string("kv_pool", e.kv_pool, false));
  return e;
}

nlohmann::json to_json(const EngineEntry& e) {
  nlohmann::json j = {{"name", e.name},
                      {"url", e.url},
                      {"role", std::string(to_string(e.role))},
                      {"model", e.model},
                      {"block_size", e.block_size_tokens}};
  if (!e.kv_events.empty()) j["kv_events"] = e.kv_events;
  if (!e.kv_replay.empty()) j["kv_replay"] = e.kv_replay;
  if (!e.profile_path.empty()) j["profile"] = e.profile_path;
  if (e.cache_blocks > 0) j["cache_blocks"] = e.cache_blocks;
  if (e.kv_capacity_tokens > 0) j["kv_capacity_tokens"] = e.kv_capacity_tokens;
  if (!e.token_ids) j["token_ids"] = false;
  if (!e.api_key_file.empty()) j["api_key_file"] = e.api_key_file;
  if (!e.kv_pool.empty()) j["kv_pool"] = e.kv_pool;
  return j;
}

Status check_engines(const std::vector<EngineEntry>& engines, const std::string& where) {
  if (engines.empty()) return Status::invalid_argument(fmt::format("{}: no engines", where));
  std::set<std::string> names;
  int both = 0, prefill = 0, decode = 0;
  const EngineEntry& first = engines.front();
  for (size_t i = 0; i < engines.size(); ++i) {
    const EngineEntry& e = engines[i];
    const std::string named = fmt::format("{}: engines[{}] ('{}')", where, i, e.name);
    if (!names.insert(e.name).second)
      return Status::invalid_argument(fmt::format("{}: the name is taken by an earlier engine", named));
    if (e.block_size_tokens != first.block_size_tokens) {
      return Status::invalid_argument(
          fmt::format("{}: block_size {} differs from engine '{}''s {} (the router keys every engine's blocks "
                      "alike)",
                      named, e.block_size_tokens, first.name, first.block_size_tokens));
    }
    if (e.model != first.model) {
      return Status::invalid_argument(fmt::format("{}: model '{}' differs from engine '{}''s '{}'", named,
                                                  e.model, first.name, first.model));
    }
    if (e.kv_pool != first.kv_pool) {
      // The Conductor prices a fetch from any engine's prefix for every engine, or for none.
      return Status::invalid_argument(fmt::format(
          "{}: kv_pool '{}' differs from engine '{}''s '{}' (the engines share one KV pool, or none does)",
          named, e.kv_pool, first.name, first.kv_pool));
    }
    (e.role == EngineRole::kBoth ? both : e.role == EngineRole::kPrefill ? prefill : decode)++;
  }
  if (both > 0 && prefill + decode > 0) {
    return Status::invalid_argument(fmt::format(
        "{}: {} engines are 'both' and {} are prefill or decode: the engines are either all colocated ('both') "
        "or split into prefill and decode",
        where, both, prefill + decode));
  }
  if (both == 0 && (prefill == 0 || decode == 0)) {
    return Status::invalid_argument(fmt::format(
        "{}: {} prefill and {} decode engines: a disaggregated cluster needs at least one of each", where,
        prefill, decode));
  }
  return Status::ok_status();
}

Result<std::vector<EngineEntry>> load_engines_file(const std::string& path) {
  auto json = read_json_file(path);
  if (!json.ok()) return json.status();
  const nlohmann::json* list = &*json;
  if (json->is_object()) {
    JsonFields f(*json, path);
    CRESCENT_RETURN_IF_ERROR(f.no_unknown_keys({"engines"}));
    auto it = json->find("engines");
    if (it == json->end()) return Status::invalid_argument(fmt::format("{}: missing field 'engines'", path));
    list = &*it;
  }
  if (!list->is_array()) {
    return Status::invalid_argument(
        fmt::format("{}: 'engines' must be an array of engine objects", path));
  }
  std::vector<EngineEntry> engines;
  for (size_t i = 0; i < list->size(); ++i) {
    auto e = engine_from_json((*list)[i], fmt::format("{}: engines[{}]", path, i));
    if (!e.ok()) return e.status();
    engines.push_back(std::move(*e));
  }
  CRESCENT_RETURN_IF_ERROR(check_engines(engines, path));
  return engines;
}

}  // namespace crescent::router
