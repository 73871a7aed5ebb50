// The C interface of crescent's SentencePiece module (libcrescent_sentencepiece.so), which tokenizer.cpp
// loads with dlopen when a model directory has a tokenizer.model.
//
// Why a module: Debian's libsentencepiece carries its own protobuf 3.14 under the same symbol names as the
// libprotobuf 3.21 the store's RPC messages use. Linked into one binary, each binds to the other's code (an
// abort in protobuf's version check, or a crash, at start-up). The module is loaded RTLD_LOCAL into a process
// whose own protobuf is static and not exported (../../CMakeLists.txt), so libsentencepiece's references
// resolve to its own copy. Only C types cross: results come back through a sink callback, so nothing is
// allocated on one side and freed on the other, and no exception leaves the module.
#pragma once

#include <cstddef>
#include <cstdint>

// The module is built with hidden visibility; these are what it exports.
#define CRESCENT_SPM_EXPORT __attribute__((visibility("default")))

extern "C" {

/// Receives `size` bytes at `data` (text, a serialized model, or int32 token ids) for `context`.
using crescent_spm_sink = void (*)(void* context, const void* data, size_t size);

/// Loads the SentencePiece model at `path`. Null on failure, with the reason sent to `error`.
CRESCENT_SPM_EXPORT void* crescent_spm_load(const char* path, crescent_spm_sink error, void* error_context);

/// Frees a model from crescent_spm_load (null is fine).
CRESCENT_SPM_EXPORT void crescent_spm_free(void* model);

/// The model's vocabulary size: ids are 0..pieces-1.
CRESCENT_SPM_EXPORT int32_t crescent_spm_pieces(const void* model);

/// The BOS id, or -1 when the model defines none.
CRESCENT_SPM_EXPORT int32_t crescent_spm_bos(const void* model);

/// The EOS id, or -1 when the model defines none.
CRESCENT_SPM_EXPORT int32_t crescent_spm_eos(const void* model);

/// Sends the text piece `id` stands for as SentencePiece's decoder renders it: "▁" (U+2581) as a space, a
/// byte piece <0xAB> as that byte, <unk> as " ⁇ ", control and unused pieces as nothing.
CRESCENT_SPM_EXPORT void crescent_spm_piece_bytes(const void* model, int32_t id, crescent_spm_sink out,
                                                  void* context);

/// Encodes `size` bytes of UTF-8 `text` and sends the ids (int32, no BOS or EOS) in one call. Returns false
/// (nothing sent) if the library fails.
CRESCENT_SPM_EXPORT bool crescent_spm_encode(const void* model, const char* text, size_t size,
                                             crescent_spm_sink ids, void* context);

/// Trains a BPE model of `vocab_size` pieces with byte fallback on the text file at `text_path` and sends the
/// serialized model to `model_out`; or returns false with the reason sent to `error`.
CRESCENT_SPM_EXPORT bool crescent_spm_train(const char* text_path, int64_t vocab_size,
                                            crescent_spm_sink model_out, void* model_context,
                                            crescent_spm_sink error, void* error_context);

}  // extern "C"
