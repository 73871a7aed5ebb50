#include "store/transfer_metadata.h"

#include <fmt/format.h>
#include <unistd.h>

namespace crescent::store {

std::string default_transfer_metadata_spec() {
  return fmt::format("dir:/tmp/crescent-store-{}/metadata", getuid());
}

Result<std::shared_ptr<transfer::MetadataService>> open_transfer_metadata(std::string_view spec) {
  if (spec.starts_with("dir:") && spec.size() > 4) {
    return transfer::make_directory_metadata(std::string(spec.substr(4)));
  }
  if (spec.starts_with("etcd:") && spec.size() > 5) {
    transfer::EtcdOptions options;
    options.endpoint = std::string(spec.substr(5));
    options.prefix = "/crescent-store";
    return transfer::make_etcd_metadata(options);
  }
  return Status::invalid_argument(
      fmt::format("transfer metadata '{}' is neither 'dir:PATH' nor 'etcd:URL'", spec));
}

}  // namespace crescent::store
