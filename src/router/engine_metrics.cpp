#include "router/engine_metrics.h"

#include <charconv>
#include <cmath>
#include <string>

namespace crescent::router {
namespace {

// The value of label `name` in a sample's label set `labels` ("a=\"1\",b=\"2\""), or empty.
std::string_view label_value(std::string_view labels, std::string_view name) {
  size_t pos = 0;
  while (pos < labels.size()) {
    while (pos < labels.size() && (labels[pos] == ',' || labels[pos] == ' ')) ++pos;
    const size_t eq = labels.find('=', pos);
    if (eq == std::string_view::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"') return {};
    const std::string_view key = labels.substr(pos, eq - pos);
    size_t end = eq + 2;
    while (end < labels.size() && labels[end] != '"') end += labels[end] == '\\' ? 2 : 1;
    if (end >= labels.size()) return {};
    if (key == name) return labels.substr(eq + 2, end - eq - 2);
    pos = end + 1;
  }
  return {};
}

std::optional<int64_t> to_int(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

void add(std::optional<double>& into, double value) { into = into.value_or(0) + value; }

}  // namespace

EngineMetrics parse_engine_metrics(std::string_view text) {
  EngineMetrics m;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line.front() == '#') continue;
    // name[{labels}] value [timestamp]
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    std::string_view labels;
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.rfind('}');
      if (close == std::string_view::npos || close < name_end) continue;
      labels = line.substr(name_end + 1, close - name_end - 1);
      value_start = close + 1;
    }
    while (value_start < line.size() && line[value_start] == ' ') ++value_start;
    std::string_view value_text = line.substr(value_start);
    value_text = value_text.substr(0, value_text.find(' '));
    // from_chars for double is in libstdc++ 11+; "NaN"/"+Inf" parse as such.
    double value = 0;
    const auto [end, ec] = std::from_chars(value_text.data(), value_text.data() + value_text.size(), value);
    if (ec != std::errc() || end != value_text.data() + value_text.size() || std::isnan(value)) continue;

    if (name == "vllm:num_requests_running" || name == "sglang:num_running_reqs") {
      add(m.requests_running, value);
    } else if (name == "vllm:num_requests_waiting" || name == "sglang:num_queue_reqs") {
      add(m.requests_waiting, value);
    } else if (name == "vllm:kv_cache_usage_perc" || name == "vllm:gpu_cache_usage_perc" ||
               name == "sglang:token_usage") {
      m.kv_cache_usage = std::max(m.kv_cache_usage.value_or(0), value);
    } else if (name == "vllm:prefix_cache_queries_total") {
      add(m.prefix_cache_queries_tokens, value);
    } else if (name == "vllm:prefix_cache_hits_total") {
      add(m.prefix_cache_hits_tokens, value);
    } else if (name == "vllm:cache_config_info") {
      if (auto b = to_int(label_value(labels, "block_size"))) m.block_size_tokens = *b;
      if (auto g = to_int(label_value(labels, "num_gpu_blocks"))) m.gpu_blocks = *g;
    }
  }
  return m;
}

}  // namespace crescent::router
