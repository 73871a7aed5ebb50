// libcrescent_sentencepiece.so: Debian's libsentencepiece behind sentencepiece_module.h's C interface.
#include "model/sentencepiece_module.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <charconv>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

void send(crescent_spm_sink sink, void* context, std::string_view text) {
  sink(context, text.data(), text.size());
}

const sentencepiece::SentencePieceProcessor& processor(const void* model) {
  return *static_cast<const sentencepiece::SentencePieceProcessor*>(model);
}

void piece_bytes(const sentencepiece::SentencePieceProcessor& p, int32_t id, crescent_spm_sink out,
                 void* context) {
  if (id < 0 || id >= p.GetPieceSize() || p.IsControl(id) || p.IsUnused(id)) return send(out, context, "");
  if (p.IsUnknown(id)) return send(out, context, " \xE2\x81\x87 ");  // " ⁇ "
  const std::string& piece = p.IdToPiece(id);
  unsigned value = 0;
  if (p.IsByte(id) && piece.size() == 6 &&  // "<0xAB>"
      std::from_chars(piece.data() + 3, piece.data() + 5, value, 16).ptr == piece.data() + 5) {
    const auto byte = static_cast<char>(value);
    return send(out, context, std::string_view(&byte, 1));
  }
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁"
  std::string text;
  for (size_t i = 0; i < piece.size();) {
    if (std::string_view(piece).substr(i, kSpace.size()) == kSpace) {
      text += ' ';
      i += kSpace.size();
    } else {
      text += piece[i++];
    }
  }
  send(out, context, text);
}

}  // namespace

extern "C" {

void* crescent_spm_load(const char* path, crescent_spm_sink error, void* error_context) {
  try {
    auto model = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const sentencepiece::util::Status status = model->Load(path);
    if (!status.ok()) {
      send(error, error_context, status.message());
      return nullptr;
    }
    return model.release();
  } catch (const std::exception& e) {
    send(error, error_context, e.what());
    return nullptr;
  }
}

void crescent_spm_free(void* model) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

int32_t crescent_spm_pieces(const void* model) {
  return processor(model).GetPieceSize();
}

int32_t crescent_spm_bos(const void* model) {
  return processor(model).bos_id();
}

int32_t crescent_spm_eos(const void* model) {
  return processor(model).eos_id();
}

void crescent_spm_piece_bytes(const void* model, int32_t id, crescent_spm_sink out, void* context) {
  try {
    piece_bytes(processor(model), id, out, context);
  } catch (const std::exception&) {
    send(out, context, "");  // (out of memory: no text rather than an exception through C)
  }
}

bool crescent_spm_encode(const void* model, const char* text, size_t size, crescent_spm_sink ids,
                         void* context) {
  try {
    std::vector<int> pieces;
    if (!processor(model).Encode(std::string_view(text, size), &pieces).ok()) return false;
    static_assert(sizeof(int) == sizeof(int32_t));
    ids(context, pieces.data(), pieces.size() * sizeof(int));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool crescent_spm_train(const char* text_path, int64_t vocab_size, crescent_spm_sink model_out,
                        void* model_context, crescent_spm_sink error, void* error_context) {
  try {
    std::string model;
    const sentencepiece::util::Status trained = sentencepiece::SentencePieceTrainer::Train(
        {{"input", text_path},
         {"vocab_size", std::to_string(vocab_size)},
         {"model_type", "bpe"},
         {"byte_fallback", "true"},
         {"minloglevel", "2"}},  // warnings and up; not its progress
        nullptr, &model);
    if (!trained.ok()) {
      send(error, error_context, trained.message());
      return false;
    }
    send(model_out, model_context, model);
    return true;
  } catch (const std::exception& e) {
    send(error, error_context, e.what());
    return false;
  }
}

}  // extern "C"
