#include "trace/line_reader.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace crescent::trace {
namespace {

constexpr unsigned kChunkBytes = 1u << 16;
constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";  // skipped at the very start of the input only

struct GzClose {
  void operator()(gzFile file) const { gzclose(file); }
};

}  // namespace

struct LineReader::Impl {
  std::unique_ptr<gzFile_s, GzClose> file;
  std::vector<char> chunk = std::vector<char>(kChunkBytes);
  size_t chunk_pos = 0;
  size_t chunk_end = 0;
};

LineReader::LineReader(std::unique_ptr<Impl> impl, size_t max_line_bytes)
    : impl_(std::move(impl)), max_line_bytes_(max_line_bytes) {}
LineReader::~LineReader() = default;

Result<std::unique_ptr<LineReader>> LineReader::open(const std::string& path, size_t max_line_bytes) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    std::string message =
        fmt::format("cannot open '{}': {}", path, error ? std::strerror(error) : "out of memory");
    return error == ENOENT ? Status::not_found(message) : Status::io_error(message);
  }
  gzbuffer(file, kChunkBytes);
  auto impl = std::make_unique<Impl>();
  impl->file.reset(file);
  return std::unique_ptr<LineReader>(new LineReader(std::move(impl), max_line_bytes));
}

Result<bool> LineReader::next() {
  Impl& s = *impl_;
  line_.clear();
  line_too_long_ = false;
  bool started = false;
  for (;;) {
    if (s.chunk_pos == s.chunk_end) {
      const int n = gzread(s.file.get(), s.chunk.data(), kChunkBytes);
      if (n <= 0) {
        int code = Z_OK;
        std::string message = gzerror(s.file.get(), &code);
        if (n < 0 || code != Z_OK) {
          if (code == Z_ERRNO) return Status::io_error(message);
          return Status::io_error(
              fmt::format("{} (corrupt or truncated gzip stream, after line {})", message, line_number_));
        }
        if (!started) return false;
        break;  // last line without a final '\n'
      }
      s.chunk_pos = 0;
      s.chunk_end = static_cast<size_t>(n);
    }
    started = true;
    const char* begin = s.chunk.data() + s.chunk_pos;
    const char* newline = static_cast<const char*>(std::memchr(begin, '\n', s.chunk_end - s.chunk_pos));
    const size_t length = newline ? static_cast<size_t>(newline - begin) : s.chunk_end - s.chunk_pos;
    if (line_too_long_ || line_.size() + length > max_line_bytes_) {
      line_too_long_ = true;
      line_.clear();
    } else {
      line_.append(begin, length);
    }
    s.chunk_pos += length + (newline ? 1 : 0);
    if (newline) break;
  }
  ++line_number_;
  if (line_number_ == 1 && line_.starts_with(kUtf8Bom)) line_.erase(0, kUtf8Bom.size());
  if (line_.ends_with('\r')) line_.pop_back();
  return true;
}

int64_t LineReader::file_bytes_read() const {
  return static_cast<int64_t>(gzoffset(impl_->file.get()));
}

}  // namespace crescent::trace
