#include "store/metrics.h"

#include <fmt/format.h>
#include <httplib.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <thread>

namespace crescent::store {

void add_gauge(std::vector<prometheus::MetricFamily>& out, std::string name, std::string help, double value,
               std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  out.push_back({std::move(name), std::move(help), prometheus::MetricType::Gauge, {metric}});
}

void add_sample(prometheus::MetricFamily& family, double value,
                std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

void add_counter(std::vector<prometheus::MetricFamily>& out, std::string name, std::string help,
                 double value) {
  prometheus::ClientMetric metric;
  metric.counter.value = value;
  out.push_back({std::move(name), std::move(help), prometheus::MetricType::Counter, {metric}});
}

class MetricsEndpoint::Impl {
 public:
  ~Impl() {
    server.stop();
    if (thread.joinable()) thread.join();
  }

  std::string body() const {
    std::vector<prometheus::MetricFamily> families =
        registry ? registry->Collect() : std::vector<prometheus::MetricFamily>{};
    for (prometheus::MetricFamily& f : collector()) families.push_back(std::move(f));
    return prometheus::TextSerializer().Serialize(families);
  }

  httplib::Server server;
  std::thread thread;
  std::shared_ptr<prometheus::Registry> registry;
  MetricsCollector collector;
  std::string address;
};

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry, MetricsCollector collector) {
  auto impl = std::make_unique<Impl>();
  impl->registry = std::move(registry);
  impl->collector = std::move(collector);
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
      port = -1;
    }
  }
  if (port < 0 || port > 65535) {
    return Status::invalid_argument(fmt::format("metrics address '{}' is not host:port", address));
  }
  const std::string host = address.substr(0, colon);
  Impl* raw = impl.get();
  impl->server.Get("/metrics", [raw](const httplib::Request&, httplib::Response& response) {
    response.set_content(raw->body(), "text/plain; version=0.0.4");
  });
  const int bound =
      port == 0 ? impl->server.bind_to_any_port(host) : (impl->server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    return Status::unavailable(fmt::format("cannot serve /metrics on {} (address in use?)", address));
  impl->address = fmt::format("{}:{}", host, bound);
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}
MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsEndpoint::~MetricsEndpoint() = default;
const std::string& MetricsEndpoint::address() const {
  return impl_->address;
}

}  // namespace crescent::store
