// Text ↔ token ids (issue 11). Byte-level: each byte of the text is one token whose id is the byte's value
// (a vocabulary of 256, the presets'). A SentencePiece `tokenizer.model` is refused for now (load_tokenizer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// The token ids of `text` (no BOS or EOS added).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// The bytes token `id` stands for: concatenated in order they give the text (streaming decodes token by
  /// token). "" for an id outside the vocabulary or a control token.
  virtual std::string token_bytes(int64_t id) const = 0;
  /// Ids are below this.
  virtual int64_t vocab_size() const = 0;
  /// "bytes", for messages.
  virtual std::string_view kind() const = 0;
};

/// The byte-level tokenizer.
std::unique_ptr<Tokenizer> byte_tokenizer();

/// The tokenizer of model directory `dir`, checked against `vocab_size` (the model's: every id the tokenizer
/// makes must have an embedding). Errors (kInvalidArgument) name the file: a DIR/tokenizer.model
/// (SentencePiece is not supported yet), or a vocabulary larger than the model's.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir, int64_t vocab_size);

}  // namespace crescent::model
