#include "model/tokenizer.h"

#include <fmt/format.h>

#include <filesystem>

namespace crescent::model {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string token_bytes(int64_t id) const override {
    return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
  int64_t vocab_size() const override { return 256; }
  std::string_view kind() const override { return "bytes"; }
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir, int64_t vocab_size) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.model").string();
  if (std::filesystem::exists(path)) {
    // Debian's libsentencepiece carries its own copy of protobuf, which clashes with the libprotobuf the
    // store links (a crash at start-up): it needs loading apart (dlopen, RTLD_DEEPBIND), not done yet.
    return Status::invalid_argument(
        fmt::format("{}: SentencePiece tokenizers are not supported yet; remove it to use bytes", path));
  }
  std::unique_ptr<Tokenizer> tokenizer = byte_tokenizer();
  const std::string source = "the byte-level tokenizer";
  if (tokenizer->vocab_size() > vocab_size) {
    return Status::invalid_argument(
        fmt::format("{} has {} tokens, the model's vocabulary only {} (config.json vocab_size)", source,
                    tokenizer->vocab_size(), vocab_size));
  }
  return tokenizer;
}

}  // namespace crescent::model
