#include "serve/output_text.h"

#include <algorithm>

namespace crescent::serve {

size_t utf8_complete_prefix(std::string_view text) {
  // The last lead byte among the final four (a continuation byte is 10xxxxxx).
  const size_t size = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, size); ++back) {
    const auto byte = static_cast<unsigned char>(text[size - back]);
    if ((byte & 0xC0) == 0x80) continue;
    const size_t length = (byte & 0xE0) == 0xC0   ? 2
                          : (byte & 0xF0) == 0xE0 ? 3
                          : (byte & 0xF8) == 0xF0 ? 4
                                                  : 1;
    return back < length ? size - back : size;
  }
  return size;  // only continuation bytes: invalid, nothing to wait for
}

OutputText::OutputText(std::shared_ptr<const model::Tokenizer> tokenizer, StopConditions stops)
    : tokenizer_(std::move(tokenizer)), stops_(std::move(stops)) {
  std::erase_if(stops_.stop, [](const std::string& s) { return s.empty(); });
  if (!stops_.ignore_eos) eos_ = tokenizer_->eos_token();
}

std::string OutputText::add(std::span<const int64_t> tokens) {
  for (int64_t token : tokens) {
    if (stopped_) break;
    ++tokens_;
    const bool counts = tokens_ >= stops_.min_tokens;  // this token may end the output
    if (counts && eos_ && token == *eos_) {
      stopped_ = true;
      break;
    }
    const size_t before = text_.size();
    text_ += tokenizer_->token_bytes(token);
    if (!counts || stops_.stop.empty()) continue;
    // A stop string that ends in this token's bytes (one that ended earlier did not count): each searched
    // from where it could have started.
    size_t cut = std::string::npos;
    for (const std::string& s : stops_.stop) {
      cut = std::min(cut, text_.find(s, before >= s.size() ? before - s.size() + 1 : 0));
    }
    if (cut != std::string::npos) {
      text_.resize(std::max(cut, sent_));  // (sent_ <= cut: a possible stop's start is never sent)
      stopped_ = true;
    }
  }
  return take_ready();
}

std::string OutputText::take_ready() {
  size_t ready = text_.size();
  if (!stopped_) {
    ready = utf8_complete_prefix(text_);
    // Hold back the longest tail that a stop string starts with.
    const std::string_view text(text_);
    for (const std::string& s : stops_.stop) {
      for (size_t n = std::min(s.size() - 1, text.size()); n > 0; --n) {
        if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
          ready = std::min(ready, text.size() - n);
          break;
        }
      }
    }
  }
  ready = std::max(ready, sent_);
  std::string out = text_.substr(sent_, ready - sent_);
  sent_ = ready;
  return out;
}

std::string OutputText::flush() {
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace crescent::serve
