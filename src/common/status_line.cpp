#include "common/status_line.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace crescent {
namespace {

constexpr auto kMinRedraw = std::chrono::milliseconds(100);  // at most 10 updates a second

}  // namespace

StatusLine::StatusLine() : enabled_(isatty(STDERR_FILENO) == 1) {}

StatusLine::~StatusLine() {
  clear();
}

void StatusLine::clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  drawn_ = false;
}

bool StatusLine::due() const {
  return enabled_ && (!drawn_ || Clock::now() - last_drawn_ >= kMinRedraw);
}

void StatusLine::draw(std::string_view text) {
  if (!due()) return;
  // \033[K erases what a longer previous line left on the right.
  fmt::print(stderr, "\r{}\033[K", text);
  std::fflush(stderr);
  drawn_ = true;
  last_drawn_ = Clock::now();
}

}  // namespace crescent
