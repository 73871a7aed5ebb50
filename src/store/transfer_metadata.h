// The transfer-engine metadata service every member of one store shares (store nodes, clients), named by a
// spec the master hands out in its Hello reply.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transfer/metadata.h"

namespace crescent::store {

/// The spec used when none is given: "dir:/tmp/crescent-store-UID/metadata" (one machine; per user).
std::string default_transfer_metadata_spec();

/// Opens the service a spec names: "dir:PATH" (transfer::make_directory_metadata) or "etcd:URL"
/// (transfer::make_etcd_metadata, prefix /crescent-store). kInvalidArgument for another form; the service's
/// error when it cannot be opened.
Result<std::shared_ptr<transfer::MetadataService>> open_transfer_metadata(std::string_view spec);

}  // namespace crescent::store
