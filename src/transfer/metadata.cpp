#include "transfer/metadata.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "common/temp_dir.h"

namespace crescent::transfer {

Status validate_metadata_name(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > 200) {
    return Status::invalid_argument(
        fmt::format("{} name must be 1..200 characters, got {}", what, name.size()));
  }
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Status::invalid_argument(fmt::format("{} name '{}' contains a control character", what, name));
    }
  }
  return Status();
}

nlohmann::json SegmentDescriptor::to_json() const {
  return {{"name", name},
          {"engine", engine},
          {"host_id", host_id},
          {"length_bytes", length_bytes},
          {"transports", transports}};
}

Result<SegmentDescriptor> SegmentDescriptor::from_json(const nlohmann::json& json) {
  if (!json.is_object()) return Status::invalid_argument("segment descriptor: not a JSON object");
  SegmentDescriptor d;
  auto get_string = [&](const char* field, std::string& out) -> Status {
    auto it = json.find(field);
    if (it == json.end() || !it->is_string()) {
      return Status::invalid_argument(
          fmt::format("segment descriptor: field '{}' missing or not a string", field));
    }
    out = it->get<std::string>();
    return Status();
  };
  CRESCENT_RETURN_IF_ERROR(get_string("name", d.name));
  CRESCENT_RETURN_IF_ERROR(get_string("engine", d.engine));
  CRESCENT_RETURN_IF_ERROR(get_string("host_id", d.host_id));
  auto length = json.find("length_bytes");
  if (length == json.end() || !length->is_number_unsigned()) {
    return Status::invalid_argument(fmt::format(
        "segment descriptor '{}': field 'length_bytes' missing or not an unsigned integer", d.name));
  }
  d.length_bytes = length->get<uint64_t>();
  auto transports = json.find("transports");
  if (transports == json.end() || !transports->is_object()) {
    return Status::invalid_argument(
        fmt::format("segment descriptor '{}': field 'transports' missing or not an object", d.name));
  }
  d.transports = *transports;
  return d;
}

namespace {

class InProcessMetadata final : public MetadataService {
 public:
  Status claim_engine(std::string_view engine) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("engine", engine));
    std::lock_guard lock(mu_);
    if (!engines_.insert(std::string(engine)).second) {
      return Status::already_exists(fmt::format("engine name '{}' is already claimed", engine));
    }
    return Status();
  }

  Status release_engine(std::string_view engine) override {
    std::lock_guard lock(mu_);
    engines_.erase(std::string(engine));
    std::erase_if(segments_, [&](const auto& entry) { return entry.second.engine == engine; });
    return Status();
  }

  Status publish(const SegmentDescriptor& descriptor) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("segment", descriptor.name));
    std::lock_guard lock(mu_);
    if (!engines_.contains(descriptor.engine)) {
      return Status::failed_precondition(
          fmt::format("engine '{}' publishes segment '{}' without claiming its name", descriptor.engine,
                      descriptor.name));
    }
    auto it = segments_.find(descriptor.name);
    if (it != segments_.end() && it->second.engine != descriptor.engine) {
      return Status::already_exists(fmt::format("segment '{}' is already published by engine '{}'",
                                                descriptor.name, it->second.engine));
    }
    segments_[descriptor.name] = descriptor;
    return Status();
  }

  Status withdraw(std::string_view segment) override {
    std::lock_guard lock(mu_);
    if (segments_.erase(std::string(segment)) == 0) {
      return Status::not_found(fmt::format("segment '{}' is not published", segment));
    }
    return Status();
  }

  Result<SegmentDescriptor> lookup(std::string_view segment) override {
    std::lock_guard lock(mu_);
    auto it = segments_.find(std::string(segment));
    if (it == segments_.end()) return Status::not_found(fmt::format("segment '{}' not found", segment));
    return it->second;
  }

  Result<std::vector<std::string>> list_segments() override {
    std::lock_guard lock(mu_);
    std::vector<std::string> names;
    for (const auto& [name, _] : segments_) names.push_back(name);
    return names;  // std::map: already sorted
  }

 private:
  std::mutex mu_;
  std::set<std::string> engines_;
  std::map<std::string, SegmentDescriptor> segments_;
};

// Directory layout: DIR/engines/<hex name> holds the owner's pid; DIR/segments/<hex name> holds
// {"pid":P,"descriptor":{...}}. Names are hex-encoded so any byte sequence is a safe file name.
class DirectoryMetadata final : public MetadataService {
 public:
  explicit DirectoryMetadata(std::filesystem::path root) : root_(std::move(root)) {}

  Status init() {
    // Private to this user: another could otherwise rewrite a segment's descriptor (and so where members
    // send KV) or read where segments lie. The default's parent (/tmp/crescent-store-UID) too.
    if (root_.has_parent_path() && root_.parent_path().filename().string().starts_with("crescent-store-")) {
      CRESCENT_RETURN_IF_ERROR(make_private_directory(root_.parent_path().string()));
    }
    CRESCENT_RETURN_IF_ERROR(make_private_directory(root_.string()));
    std::error_code ec;
    for (const char* sub : {"engines", "segments"}) {
      std::filesystem::create_directories(root_ / sub, ec);
      if (ec) {
        return Status::io_error(
            fmt::format("metadata directory '{}': cannot create: {}", (root_ / sub).string(), ec.message()));
      }
    }
    return Status();
  }

  ~DirectoryMetadata() override {
    std::vector<std::string> engines;
    {
      std::lock_guard lock(mu_);
      engines.assign(claimed_.begin(), claimed_.end());
    }
    for (const auto& engine : engines) (void)release_engine(engine);
  }

  Status claim_engine(std::string_view engine) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("engine", engine));
    std::lock_guard lock(mu_);
    const auto path = entry_path("engines", engine);
    // The claim appears atomically with its pid in it: written to a private temporary file, then link(2)ed
    // into place, which fails with EEXIST if another claim exists. (Creating the final file with O_EXCL and
    // writing the pid afterwards would let a concurrent claimer read an empty pid and take it as dead.)
    const std::string temp = path.string() + fmt::format(".tmp.{}", ::getpid());
    {
      std::ofstream out(temp, std::ios::trunc);
      out << ::getpid();
      if (!out.flush()) {
        ::unlink(temp.c_str());
        return Status::io_error(fmt::format("metadata directory: cannot write '{}'", temp));
      }
    }
    // Two attempts: the second after removing a claim whose owner died.
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (::link(temp.c_str(), path.c_str()) == 0) {
        ::unlink(temp.c_str());
        claimed_.insert(std::string(engine));
        return Status();
      }
      if (errno != EEXIST) {
        const int err = errno;
        ::unlink(temp.c_str());
        return Status::io_error(
            fmt::format("metadata directory: cannot create '{}': {}", path.string(), std::strerror(err)));
      }
      const pid_t owner = read_pid(path);
      if (owner > 0 && process_alive(owner)) {
        ::unlink(temp.c_str());
        return Status::already_exists(
            fmt::format("engine name '{}' is already claimed by live process {}", engine, owner));
      }
      ::unlink(path.c_str());  // a dead owner's claim: its lease has ended
    }
    ::unlink(temp.c_str());
    return Status::already_exists(fmt::format("engine name '{}' is being claimed concurrently", engine));
  }

  Status release_engine(std::string_view engine) override {
    std::lock_guard lock(mu_);
    if (!claimed_.erase(std::string(engine))) return Status();
    for (auto it = published_.begin(); it != published_.end();) {
      if (it->second == engine) {
        ::unlink(entry_path("segments", it->first).c_str());
        it = published_.erase(it);
      } else {
        ++it;
      }
    }
    ::unlink(entry_path("engines", engine).c_str());
    return Status();
  }

  Status publish(const SegmentDescriptor& descriptor) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("segment", descriptor.name));
    std::lock_guard lock(mu_);
    if (!claimed_.contains(descriptor.engine)) {
      return Status::failed_precondition(
          fmt::format("engine '{}' publishes segment '{}' without claiming its name here", descriptor.engine,
                      descriptor.name));
    }
    auto existing = read_entry(descriptor.name);
    if (existing.ok() && existing->engine != descriptor.engine) {
      return Status::already_exists(
          fmt::format("segment '{}' is already published by engine '{}'", descriptor.name, existing->engine));
    }
    const nlohmann::json entry = {{"pid", ::getpid()}, {"descriptor", descriptor.to_json()}};
    const auto path = entry_path("segments", descriptor.name);
    const auto temp = path.string() + fmt::format(".tmp.{}", ::getpid());
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out << entry.dump();
      if (!out.flush()) {
        ::unlink(temp.c_str());
        return Status::io_error(fmt::format("metadata directory: cannot write '{}'", temp));
      }
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      ::unlink(temp.c_str());
      return Status::io_error(
          fmt::format("metadata directory: cannot rename to '{}': {}", path.string(), std::strerror(errno)));
    }
    published_[descriptor.name] = descriptor.engine;
    return Status();
  }

  Status withdraw(std::string_view segment) override {
    std::lock_guard lock(mu_);
    auto it = published_.find(std::string(segment));
    if (it == published_.end()) {
      return Status::not_found(fmt::format("segment '{}' is not published by this process", segment));
    }
    ::unlink(entry_path("segments", segment).c_str());
    published_.erase(it);
    return Status();
  }

  Result<SegmentDescriptor> lookup(std::string_view segment) override {
    std::lock_guard lock(mu_);
    return read_entry(segment);
  }

  Result<std::vector<std::string>> list_segments() override {
    std::lock_guard lock(mu_);
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& file : std::filesystem::directory_iterator(root_ / "segments", ec)) {
      const std::string hex = file.path().filename().string();
      if (hex.find('.') != std::string::npos) continue;  // a temporary file
      std::string name = from_hex(hex);
      if (read_entry(name).ok()) names.push_back(std::move(name));
    }
    if (ec) return Status::io_error(fmt::format("metadata directory '{}': {}", root_.string(), ec.message()));
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  static std::string to_hex(std::string_view name) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string hex;
    for (unsigned char c : name) {
      hex.push_back(kDigits[c >> 4]);
      hex.push_back(kDigits[c & 15]);
    }
    return hex;
  }
  static std::string from_hex(std::string_view hex) {
    std::string name;
    auto digit = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
      name.push_back(static_cast<char>(digit(hex[i]) * 16 + digit(hex[i + 1])));
    return name;
  }
  std::filesystem::path entry_path(const char* kind, std::string_view name) const {
    return root_ / kind / to_hex(name);
  }
  static pid_t read_pid(const std::filesystem::path& path) {
    std::ifstream in(path);
    long pid = 0;
    in >> pid;
    return static_cast<pid_t>(pid);
  }
  static bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

  // The descriptor of `segment` if its publishing process is alive; a dead publisher's entry is removed.
  Result<SegmentDescriptor> read_entry(std::string_view segment) {
    const auto path = entry_path("segments", segment);
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::not_found(fmt::format("segment '{}' not found in '{}'", segment, root_.string()));
    std::stringstream text;
    text << in.rdbuf();
    auto entry = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!entry.is_object() || !entry.contains("pid") || !entry["pid"].is_number_integer() ||
        !entry.contains("descriptor")) {
      return Status::invalid_argument(
          fmt::format("metadata file '{}' is not a segment entry", path.string()));
    }
    if (!process_alive(entry["pid"].get<pid_t>())) {
      ::unlink(path.c_str());
      return Status::not_found(fmt::format("segment '{}' not found (its owner process exited)", segment));
    }
    return SegmentDescriptor::from_json(entry["descriptor"]);
  }

  std::filesystem::path root_;
  std::mutex mu_;
  std::set<std::string> claimed_;                 // engines claimed by this process
  std::map<std::string, std::string> published_;  // segment -> engine, published by this process
};

}  // namespace

std::shared_ptr<MetadataService> make_in_process_metadata() {
  return std::make_shared<InProcessMetadata>();
}

Result<std::shared_ptr<MetadataService>> make_directory_metadata(const std::string& directory) {
  if (directory.empty()) return Status::invalid_argument("metadata directory: empty path");
  auto service = std::make_shared<DirectoryMetadata>(directory);
  CRESCENT_RETURN_IF_ERROR(service->init());
  return std::shared_ptr<MetadataService>(std::move(service));
}

std::string default_metadata_spec() {
  return fmt::format("dir:/tmp/crescent-store-{}/metadata", ::getuid());
}

Result<std::shared_ptr<MetadataService>> open_metadata(std::string_view spec) {
  if (spec.starts_with("dir:") && spec.size() > 4)
    return make_directory_metadata(std::string(spec.substr(4)));
  if (spec.starts_with("etcd:") && spec.size() > 5) {
    EtcdOptions options;
    options.endpoint = std::string(spec.substr(5));
    options.prefix = "/crescent-store";
    return make_etcd_metadata(options);
  }
  return Status::invalid_argument(
      fmt::format("transfer metadata '{}' is neither 'dir:PATH' nor 'etcd:URL'", spec));
}

}  // namespace crescent::transfer
