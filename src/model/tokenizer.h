// Text ↔ token ids (issue 11). Byte-level by default: each byte of the text is one token whose id is the
// byte's value (a vocabulary of 256, the presets'). A model directory with a SentencePiece `tokenizer.model`
// (Llama's) is tokenized by Debian's libsentencepiece, a Hugging Face `tokenizer.json` (Llama 3's, Qwen's) by
// crescent's own byte-level BPE (hf_tokenizer.h) (load_tokenizer).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// The token ids the model reads for prompt `text`: bytes and tokenizer.json add nothing (special-token
  /// strings in the text become their ids); SentencePiece puts BOS first when the model defines one (as
  /// Llama's tokenizers do), never EOS.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// The bytes token `id` stands for: concatenated in order they give the text (streaming decodes token by
  /// token). "" for an id outside the vocabulary or a control token.
  virtual std::string token_bytes(int64_t id) const = 0;
  /// The end-of-sequence id generation stops at (SentencePiece's </s>, tokenizer_config.json's eos_token), or
  /// none (bytes).
  virtual std::optional<int64_t> eos_token() const = 0;
  /// Ids are below this.
  virtual int64_t vocab_size() const = 0;
  /// "bytes", "sentencepiece" or "huggingface", for messages.
  virtual std::string_view kind() const = 0;
};

/// The byte-level tokenizer.
std::unique_ptr<Tokenizer> byte_tokenizer();

/// The tokenizer of model directory `dir`: DIR/tokenizer.json (Hugging Face) when there is one, else
/// DIR/tokenizer.model (SentencePiece), else bytes; checked against `vocab_size` (the model's: every id the
/// tokenizer makes must have an embedding). Errors (kInvalidArgument) name the file: a tokenizer.json with
/// a feature crescent does not implement (load_huggingface_tokenizer), a tokenizer.model libsentencepiece
/// cannot load, or a vocabulary larger than the model's.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir, int64_t vocab_size);

/// Trains a SentencePiece BPE model of `vocab_size` pieces on the UTF-8 text file `text_path` (a sentence a
/// line) with byte fallback (any text encodes, never to <unk>), and writes it to `out_path`: how
/// `crescent model init --train-tokenizer` and the tests make a tokenizer.model. Errors (kInvalidArgument)
/// name the file: unreadable, no text, or too few pieces for its characters plus the 256 bytes and <unk> <s>
/// </s>.
Status train_sentencepiece(const std::string& text_path, int64_t vocab_size, const std::string& out_path);

}  // namespace crescent::model
