// /metrics (Prometheus text exposition) for the store's processes: a prometheus-cpp registry for what is
// observed as it happens (RPC latency histograms) plus families computed at scrape time from a process's own
// counters (Master::stats), so no number is kept twice.
#pragma once

#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace crescent::store {

/// Families built at each scrape.
using MetricsCollector = std::function<std::vector<prometheus::MetricFamily>()>;

/// Appends a one-sample gauge or counter family (counters: `name` should end in _total).
void add_gauge(std::vector<prometheus::MetricFamily>& out, std::string name, std::string help, double value,
               std::vector<prometheus::ClientMetric::Label> labels = {});
/// Adds one more gauge sample (other labels) to `family`.
void add_sample(prometheus::MetricFamily& family, double value,
                std::vector<prometheus::ClientMetric::Label> labels);
void add_counter(std::vector<prometheus::MetricFamily>& out, std::string name, std::string help,
                 double value);

/// An HTTP endpoint (cpp-httplib; prometheus-cpp's civetweb exposer takes ~2 s to stop) serving GET /metrics
/// until destroyed.
class MetricsEndpoint {
 public:
  /// Binds `address` ("host:port", port 0 picks one) and serves `registry` and `collector`'s families.
  /// kUnavailable naming the address when it cannot be bound.
  static Result<std::unique_ptr<MetricsEndpoint>> start(const std::string& address,
                                                        std::shared_ptr<prometheus::Registry> registry,
                                                        MetricsCollector collector);
  ~MetricsEndpoint();
  /// "host:PORT" as bound.
  const std::string& address() const;

  class Impl;

 private:
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
