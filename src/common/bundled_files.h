// Finding the files crescent ships with (configs/*.json, data/traces/*), wherever the binary runs from.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent {

/// The directories searched for bundled files, in order: $CRESCENT_DATA_DIR when set; `<dir of the running
/// executable>/../share/crescent` (where `cmake --install` puts them: the data directory relative to the
/// binary's); the source tree the binary was built from (a build-tree binary).
std::vector<std::string> bundled_file_dirs();

/// The path of the bundled file `relative` (e.g. "configs/paper-fig5.json"): the first of
/// bundled_file_dirs() that has it. Errors: kNotFound naming the file and every place looked.
Result<std::string> bundled_file(std::string_view relative);

}  // namespace crescent
