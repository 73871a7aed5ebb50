// Parsing of flag values shared by the subcommands: sizes with binary suffixes, comma lists, bounded
// integers. Errors name the flag and the value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/secret.h"
#include "common/status.h"
#include "common/text_format.h"  // kKiB, kMiB, kGiB, format_size

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace crescent::cli {

/// `text` cut at every `separator` (an empty text gives one empty item).
std::vector<std::string> split(const std::string& text, char separator);
/// A comma-separated list; kInvalidArgument naming `flag` for an empty item.
Result<std::vector<std::string>> parse_list(std::string_view flag, const std::string& text);
/// Plain bytes or a binary suffix: 4096, 4KiB, 4K, 64MiB, 1GiB (case-insensitive, optional "B"), at most 1
/// TiB. kInvalidArgument naming `flag` and `text` otherwise.
Result<uint64_t> parse_size(std::string_view flag, const std::string& text);
/// An integer in [min, max]; kInvalidArgument naming `flag` and `text` otherwise.
Result<long> parse_int(std::string_view flag, const std::string& text, long min, long max);
/// A comma-separated list of integers in [min, max] (parse_list, then parse_int on each item).
Result<std::vector<long>> parse_int_list(std::string_view flag, const std::string& text, long min, long max);

/// Adds --cluster-secret-file (also $CRESCENT_CLUSTER_SECRET_FILE) to `command`, stored in `file`: the
/// secret every member of a cluster holds (docs/serving.md, "Who may talk to what"). `what`: what it admits.
CLI::Option* add_cluster_secret_option(CLI::App* command, std::string& file, std::string_view what);
/// The cluster secret in `file` (ClusterSecret::from_file). kInvalidArgument when none is given, saying how
/// to make one, or when the file is unreadable, malformed or readable by others.
Result<ClusterSecret> load_cluster_secret(const std::string& file);

}  // namespace crescent::cli
