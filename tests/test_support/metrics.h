// Reading a server's Prometheus /metrics in tests.
#pragma once

#include <httplib.h>

#include <sstream>
#include <string>

namespace crescent::test {

/// The value of the metric line starting with `name_and_labels` (e.g. `crescent_instances_up{role="decode"}`)
/// in the /metrics of the HTTP server on 127.0.0.1:`port`; -1 when absent or when the server does not answer.
inline double scrape_metric(int port, const std::string& name_and_labels) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  if (!res) return -1;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name_and_labels + " ", 0) == 0) return std::stod(line.substr(name_and_labels.size() + 1));
  }
  return -1;
}

}  // namespace crescent::test
