// The safetensors format, in which models are shipped with an
// HF-style config.json: 8 bytes of little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ..., "__metadata__":
// {...}}, then the tensors' bytes (little-endian, row-major), offsets relative to their start, covering them
// without holes or overlaps. Reading checks all of that and names what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::model {

/// Element types crescent reads and writes.
enum class DType { kF32, kBF16 };

/// Bytes per element: 4 for F32, 2 for BF16.
size_t dtype_bytes(DType dtype);
/// The header's name: "F32", "BF16".
std::string_view to_string(DType dtype);

/// One tensor of a file, its bytes inside the file's buffer.
struct Tensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  std::span<const std::byte> data;
  /// Product of the shape (1 for a scalar).
  int64_t elements() const;
};

/// A safetensors file read whole into memory. Move-only: its tensors point into its buffer.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  /// Reads and checks `path`. Errors (kNotFound: no such file; kInvalidArgument: everything else) start with
  /// the path and name the problem: a file shorter than its header says ("truncated: ..."), a header that is
  /// not a JSON object, a tensor entry with a missing or malformed field, an unsupported dtype, data offsets
  /// outside the data or not matching shape x dtype, tensors that overlap or leave holes.
  static Result<SafetensorsFile> read(const std::string& path);

  /// The tensors, in offset order.
  std::span<const Tensor> tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const Tensor* find(std::string_view name) const;
  /// The header's "__metadata__" (string to string).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::vector<std::byte> bytes_;
  std::vector<Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A tensor to write: `data` holds elements() * dtype_bytes(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

/// Writes `tensors` (in this order) and `metadata` to `path`, whole or not at all (a temporary file and a
/// rename). Errors: kInvalidArgument for a duplicate or empty name or data of the wrong size; kIoError naming
/// the path.
Status write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace crescent::model
