#include "model/tokenizer.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <type_traits>

#include "common/atomic_file.h"
#include "model/hf_tokenizer.h"
#include "model/sentencepiece_module.h"

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
  std::optional<int64_t> eos_token() const override { return std::nullopt; }
  int64_t vocab_size() const override { return 256; }
  std::string_view kind() const override { return "bytes"; }
};

// The SentencePiece module (sentencepiece_module.h), opened once: the first of its candidate paths that
// loads.
struct SentencePieceModule {
  decltype(&crescent_spm_load) load = nullptr;
  decltype(&crescent_spm_free) free = nullptr;
  decltype(&crescent_spm_pieces) pieces = nullptr;
  decltype(&crescent_spm_bos) bos = nullptr;
  decltype(&crescent_spm_eos) eos = nullptr;
  decltype(&crescent_spm_piece_bytes) piece_bytes = nullptr;
  decltype(&crescent_spm_encode) encode = nullptr;
  decltype(&crescent_spm_train) train = nullptr;
};

// Where the module may be, in order: beside the running executable (a build tree's build/<preset>/), where
// `cmake --install` puts it relative to the executable, and where this build made it (test executables).
std::vector<std::string> module_candidates() {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back((exe.parent_path() / CRESCENT_SENTENCEPIECE_MODULE_NAME).string());
    paths.push_back((exe.parent_path() / CRESCENT_MODULES_FROM_BIN / CRESCENT_SENTENCEPIECE_MODULE_NAME)
                        .lexically_normal()
                        .string());
  }
  paths.emplace_back(CRESCENT_SENTENCEPIECE_MODULE_BUILT);
  return paths;
}

Result<SentencePieceModule> open_sentencepiece_module() {
  std::string failures;
  for (const std::string& path : module_candidates()) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    // RTLD_LOCAL: libsentencepiece's protobuf symbols stay out of the global scope, and its own references
    // find nothing there (this binary's protobuf is static and not exported), so they bind to its copy.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      failures += fmt::format("; {}: {}", path, ::dlerror());
      continue;
    }
    SentencePieceModule m;
    bool complete = true;
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
      complete = complete && fn != nullptr;
    };
    bind(m.load, "crescent_spm_load");
    bind(m.free, "crescent_spm_free");
    bind(m.pieces, "crescent_spm_pieces");
    bind(m.bos, "crescent_spm_bos");
    bind(m.eos, "crescent_spm_eos");
    bind(m.piece_bytes, "crescent_spm_piece_bytes");
    bind(m.encode, "crescent_spm_encode");
    bind(m.train, "crescent_spm_train");
    if (complete) return m;  // the handle stays open for the process's life
    failures += fmt::format("; {}: not crescent's SentencePiece module (a function is missing)", path);
    ::dlclose(handle);
  }
  if (failures.empty()) {
    failures = fmt::format(": not found in {}", fmt::join(module_candidates(), ", "));
  }
  return Status::not_found(fmt::format("crescent's SentencePiece module did not load{}", failures));
}

Result<const SentencePieceModule*> sentencepiece_module() {
  static const Result<SentencePieceModule> module = open_sentencepiece_module();
  if (!module.ok()) return module.status();
  return &module.value();
}

// A sink appending what it receives to the std::string at `context`.
void append_to_string(void* context, const void* data, size_t size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), size);
}

// A SentencePiece model through the module. The text of each id is worked out once, at load.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path) {
    auto module = sentencepiece_module();
    if (!module.ok()) return Status::invalid_argument(fmt::format("{}: {}", path, module.status().message()));
    std::string error;
    void* model = (*module)->load(path.c_str(), append_to_string, &error);
    if (model == nullptr) {
      return Status::invalid_argument(
          fmt::format("{}: not a SentencePiece model that libsentencepiece can load: {}", path, error));
    }
    return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(**module, model));
  }
  ~SentencePieceTokenizer() override { module_.free(model_); }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids;
    if (bos_ >= 0) ids.push_back(bos_);
    // Encoding fails only for a model that did not load, which load() refused.
    (void)module_.encode(
        model_, text.data(), text.size(),
        [](void* context, const void* data, size_t size) {
          auto& out = *static_cast<std::vector<int64_t>*>(context);
          const auto* pieces = static_cast<const int32_t*>(data);
          out.insert(out.end(), pieces, pieces + size / sizeof(int32_t));
        },
        &ids);
    return ids;
  }
  std::string token_bytes(int64_t id) const override {
    return id >= 0 && id < static_cast<int64_t>(bytes_.size()) ? bytes_[id] : std::string();
  }
  std::optional<int64_t> eos_token() const override {
    return eos_ >= 0 ? std::optional<int64_t>(eos_) : std::nullopt;
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::string_view kind() const override { return "sentencepiece"; }

 private:
  SentencePieceTokenizer(const SentencePieceModule& module, void* model)
      : module_(module), model_(model), bos_(module.bos(model)), eos_(module.eos(model)) {
    bytes_.resize(static_cast<size_t>(module.pieces(model)));
    for (size_t id = 0; id < bytes_.size(); ++id) {
      module.piece_bytes(model, static_cast<int32_t>(id), append_to_string, &bytes_[id]);
    }
  }

  const SentencePieceModule module_;  // copied: still usable once the static one is destroyed at exit
  void* const model_;
  const int32_t bos_, eos_;         // -1: none
  std::vector<std::string> bytes_;  // by id
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir, int64_t vocab_size) {
  const std::string hf_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  const std::string path = (std::filesystem::path(dir) / "tokenizer.model").string();
  std::unique_ptr<Tokenizer> tokenizer;
  std::string source;
  if (std::filesystem::exists(hf_path)) {
    auto loaded = load_huggingface_tokenizer(hf_path);
    if (!loaded.ok()) return loaded.status();
    tokenizer = std::move(loaded).value();
    source = hf_path;
  } else if (std::filesystem::exists(path)) {
    auto loaded = SentencePieceTokenizer::load(path);
    if (!loaded.ok()) return loaded.status();
    tokenizer = std::move(loaded).value();
    source = path;
  } else {
    tokenizer = byte_tokenizer();
    source = "the byte-level tokenizer";
  }
  if (tokenizer->vocab_size() > vocab_size) {
    return Status::invalid_argument(
        fmt::format("{} has {} tokens, the model's vocabulary only {} (config.json vocab_size)", source,
                    tokenizer->vocab_size(), vocab_size));
  }
  return tokenizer;
}

Status train_sentencepiece(const std::string& text_path, int64_t vocab_size, const std::string& out_path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(text_path, ec) || std::filesystem::file_size(text_path, ec) == 0) {
    return Status::invalid_argument(
        fmt::format("{}: no text to train a tokenizer on (missing or empty)", text_path));
  }
  auto module = sentencepiece_module();
  if (!module.ok()) return module.status();
  std::string model, error;
  if (!(*module)->train(text_path.c_str(), vocab_size, append_to_string, &model, append_to_string, &error)) {
    return Status::invalid_argument(fmt::format("{}: training a {}-piece SentencePiece tokenizer failed: {}",
                                                text_path, vocab_size, error));
  }
  return write_file_atomically(out_path, model);
}

}  // namespace crescent::model
