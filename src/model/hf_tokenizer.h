// A Hugging Face `tokenizer.json` (issue 23 §1): the byte-level BPE tokenizers GPT-2, Llama 3 and Qwen 2/3
// ship, read and run in C++ (no Python, no Rust). Checked id for id against a JS implementation of
// tokenizer.json on the real Llama 3 and Qwen 3 files (tests/model/hf_tokenizer_test.cpp).
//
// Supported (anything else in the file is refused at load with an error naming the file and the type):
// - model: "BPE" with byte-level symbols; merges as "a b" strings or [a, b] arrays; ignore_merges (Llama 3);
//   no dropout, no byte_fallback, no continuing_subword_prefix / end_of_word_suffix (empty strings are fine).
// - normalizer: null, "NFC" (ICU), or a "Sequence" of those.
// - pre_tokenizer: "ByteLevel" (add_prefix_space false; use_regex true splits with GPT-2's pattern), alone or
//   last in a "Sequence" after "Split" steps (pattern Regex or String, behavior "Isolated", invert false).
//   The split regexes run on PCRE2 (UTF + UCP, JIT when available); GPT-2's, Llama 3's and Qwen 2/3's are
//   matched by hand on ASCII text, with the same pieces (model/split_pattern.h).
// - decoder: null or "ByteLevel". post_processor: ignored: encode() adds nothing around the text (no
// BOS/EOS).
// - added_tokens: recognised in the raw text before normalization and pre-tokenization, leftmost-longest, as
//   HF does; lstrip/rstrip take the whitespace beside a match into it. single_word true, and normalized true
//   with a normalizer, are refused (neither Llama 3 nor Qwen 3 uses them).
//
// Invalid UTF-8: every maximal ill-formed subsequence of the input becomes U+FFFD before anything else (the
// WHATWG decoder's rule, which is what the JS oracle sees when it decodes the same bytes with TextDecoder;
// HF's Rust tokenizers only take valid strings). So invalid bytes encode as the tokens of "\xEF\xBF\xBD", and
// decoding gives U+FFFD back, not the original bytes.
//
// A possible difference from the JS oracle, not from HF: "(?i:'s|...)" runs case-insensitively on PCRE2 as in
// HF's Rust, so "'ſ" (U+017F, long s) can be a contraction piece, where the JS rewrite ([sS]) does not match
// it.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/token_prefix_cache.h"
#include "model/tokenizer.h"

namespace crescent::model {

/// The default size of a tokenizer's prefix cache (below): ~450 distinct 32 KiB English prompts.
inline constexpr size_t kDefaultTokenPrefixCacheBytes = size_t{32} << 20;

/// Loads the tokenizer.json at `path`. The EOS token is tokenizer_config.json's `eos_token` beside it (a
/// string or an {"content": ...} object) when that file names a token of this vocabulary, else none.
/// kind() is "huggingface"; vocab_size() is one more than the largest id of the model's vocab and the added
/// tokens. encode() is thread-safe: each thread keeps its own cache of recently encoded words (about 2.3 MiB
/// per thread and tokenizer, for the last 4 tokenizers it used). Sections of text (between added tokens) of
/// 1 KiB or more (TokenPrefixCache::kMinTextBytes) are also kept with their ids, up to `prefix_cache_bytes`
/// shared by the threads under a mutex (0: none): a section starting with the same bytes as one kept reuses
/// its ids up to a cut the pre-tokenizer vouches for, and tokenizes only the rest
/// (model/token_prefix_cache.h; only with one of the three hand-matched split patterns, split_pattern.h).
/// token_bytes(): a vocab token's bytes (ByteLevel decoded), a non-special added token's content, "" for a
/// special added token (as HF's decode with skip_special_tokens).
/// Errors (kInvalidArgument) start with `path`: unreadable or not JSON, a type or option listed above as not
/// supported (named), a merge whose parts or result are not in the vocab, a regex PCRE2 does not compile.
Result<std::unique_ptr<Tokenizer>> load_huggingface_tokenizer(
    const std::string& path, size_t prefix_cache_bytes = kDefaultTokenPrefixCacheBytes);

/// The counts of `tokenizer`'s prefix cache (load_huggingface_tokenizer), or none when it is not a Hugging
/// Face tokenizer or has no prefix cache.
std::optional<TokenPrefixCache::Stats> token_prefix_cache_stats(const Tokenizer& tokenizer);

}  // namespace crescent::model
