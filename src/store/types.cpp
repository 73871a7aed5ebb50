#include "store/types.h"

#include <fmt/format.h>

#include "common/name_table.h"

namespace crescent::store {

Status validate_key(std::string_view key) {
  if (key.empty()) return Status::invalid_argument("key is empty (keys are 1 to 1024 bytes)");
  if (key.size() > kMaxKeyBytes) {
    return Status::invalid_argument(
        fmt::format("key is {} bytes, more than the limit of {} bytes", key.size(), kMaxKeyBytes));
  }
  return Status();
}

std::string_view tier_name(ReplicaTier tier) {
  return tier == ReplicaTier::kDram ? "dram" : "ssd";
}

namespace {
constexpr NameTable<PinKind, 3> kPins{
    "pin", {{{"none", PinKind::kNone}, {"soft", PinKind::kSoft}, {"hard", PinKind::kHard}}}};
constexpr NameTable<AllocationStrategy, 3> kStrategies{"allocation strategy",
                                                       {{{"random", AllocationStrategy::kRandom},
                                                         {"most-free", AllocationStrategy::kMostFree},
                                                         {"local-first", AllocationStrategy::kLocalFirst}}}};
}  // namespace

std::string_view pin_name(PinKind pin) {
  return kPins.name(pin);
}
Result<PinKind> parse_pin(std::string_view name) {
  return kPins.parse(name);
}
std::string_view strategy_name(AllocationStrategy strategy) {
  return kStrategies.name(strategy);
}
Result<AllocationStrategy> parse_strategy(std::string_view name) {
  return kStrategies.parse(name);
}

}  // namespace crescent::store
