#include "cli/flags.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>

namespace crescent::cli {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(separator, start);
    items.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return items;
    start = end + 1;
  }
}

Result<std::vector<std::string>> parse_list(std::string_view flag, const std::string& text) {
  std::vector<std::string> items = split(text, ',');
  for (const std::string& item : items) {
    if (item.empty()) return Status::invalid_argument(fmt::format("{}: empty item in '{}'", flag, text));
  }
  return items;
}

Result<uint64_t> parse_size(std::string_view flag, const std::string& text) {
  const auto bad = [&] {
    return Status::invalid_argument(
        fmt::format("{}: '{}' is not a size (expected bytes or a KiB/MiB/GiB suffix, e.g. 4096, 64KiB, 1MiB)",
                    flag, text));
  };
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return bad();
  std::string suffix(end, text.data() + text.size());
  std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  uint64_t unit = 0;
  if (suffix.empty() || suffix == "b") unit = 1;
  if (suffix == "k" || suffix == "kib") unit = kKiB;
  if (suffix == "m" || suffix == "mib") unit = kMiB;
  if (suffix == "g" || suffix == "gib") unit = kGiB;
  if (unit == 0 || value > (uint64_t{1} << 40) / unit) return bad();
  return value * unit;
}

Result<long> parse_int(std::string_view flag, const std::string& text, long min, long max) {
  long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return Status::invalid_argument(
        fmt::format("{}: '{}' is not an integer in {}..{}", flag, text, min, max));
  }
  return value;
}

Result<std::vector<long>> parse_int_list(std::string_view flag, const std::string& text, long min, long max) {
  Result<std::vector<std::string>> items = parse_list(flag, text);
  if (!items.ok()) return items.status();
  std::vector<long> out;
  for (const std::string& item : *items) {
    Result<long> value = parse_int(flag, item, min, max);
    if (!value.ok()) return value.status();
    out.push_back(*value);
  }
  return out;
}

CLI::Option* add_cluster_secret_option(CLI::App* command, std::string& file, std::string_view what) {
  return command
      ->add_option(
          "--cluster-secret-file", file,
          fmt::format("The cluster's secret (required; `crescent serve secret FILE` writes one): {}", what))
      ->envname("CRESCENT_CLUSTER_SECRET_FILE");
}

Result<ClusterSecret> load_cluster_secret(const std::string& file) {
  if (file.empty()) {
    return Status::invalid_argument(
        "--cluster-secret-file FILE (or $CRESCENT_CLUSTER_SECRET_FILE) is required: the members of a cluster "
        "share a secret (`crescent serve secret FILE` writes one; copy it to every host of the cluster)");
  }
  return ClusterSecret::from_file(file);
}

}  // namespace crescent::cli
