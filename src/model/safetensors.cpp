#include "model/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"

namespace crescent::model {
namespace {

using nlohmann::json;

constexpr size_t kLengthBytes = 8;
// A header longer than this is not a model's (the reference implementation's limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

Result<DType> parse_dtype(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  return Status::invalid_argument(fmt::format("dtype \"{}\" is not supported (F32, BF16)", name));
}

// Checks one header entry and returns its tensor (data not yet attached) and offsets.
Result<std::pair<Tensor, std::pair<uint64_t, uint64_t>>> parse_entry(const std::string& name,
                                                                     const json& entry) {
  const auto bad = [&](const std::string& what) {
    return Status::invalid_argument(fmt::format("tensor \"{}\": {}", name, what));
  };
  if (name.empty()) return bad("an empty name");
  if (!entry.is_object()) return bad("its entry is not an object");
  Tensor t;
  t.name = name;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) return bad("\"dtype\" is missing or not a string");
  auto parsed = parse_dtype(dtype->get<std::string>());
  if (!parsed.ok()) return bad(parsed.status().message());
  t.dtype = *parsed;
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) return bad("\"shape\" is missing or not an array");
  for (const json& d : *shape) {
    if (!d.is_number_unsigned())
      return bad(fmt::format("shape {} holds a value that is not a count", shape->dump()));
    t.shape.push_back(d.get<int64_t>());
  }
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return bad("\"data_offsets\" is missing or not [begin, end]");
  }
  const auto begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
  if (end < begin) return bad(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
  // elements() * dtype bytes, checked for overflow against the span.
  uint64_t bytes = dtype_bytes(t.dtype);
  for (int64_t d : t.shape) {
    if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return bad(fmt::format("shape {} is too large", shape->dump()));
    }
    bytes *= static_cast<uint64_t>(d);
  }
  if (end - begin != bytes) {
    return bad(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", begin, end,
                           end - begin, shape->dump(), to_string(t.dtype), bytes));
  }
  return std::make_pair(std::move(t), std::make_pair(begin, end));
}

}  // namespace

size_t dtype_bytes(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

std::string_view to_string(DType dtype) {
  return dtype == DType::kF32 ? "F32" : "BF16";
}

int64_t Tensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::not_found(fmt::format("{}: no such file", path));
  }
  const auto fail = [&](const std::string& what) {
    return Status::invalid_argument(fmt::format("{}: {}", path, what));
  };
  std::ifstream in(path, std::ios::binary);
  SafetensorsFile file;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || !in)
    return Status::io_error(fmt::format("{}: cannot read: {}", path, ec ? ec.message() : "open failed"));
  file.bytes_.resize(size);
  if (!in.read(reinterpret_cast<char*>(file.bytes_.data()), static_cast<std::streamsize>(size))) {
    return Status::io_error(fmt::format("{}: cannot read its {} bytes", path, size));
  }
  if (size < kLengthBytes)
    return fail(fmt::format("truncated: {} bytes, not even the 8-byte header length", size));
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) header_bytes |= static_cast<uint64_t>(file.bytes_[i]) << (8 * i);
  if (header_bytes > kMaxHeaderBytes)
    return fail(fmt::format("a header length of {} bytes is not a safetensors file's", header_bytes));
  if (header_bytes > size - kLengthBytes) {
    return fail(fmt::format("truncated: the header says {} bytes of JSON, the file has {} after the length",
                            header_bytes, size - kLengthBytes));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(file.bytes_.data()) + kLengthBytes,
                                     header_bytes);
  const json header = json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return fail("the header is not a JSON object");
  const uint64_t data_start = kLengthBytes + header_bytes;
  const uint64_t data_bytes = size - data_start;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, Tensor>> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return fail("\"__metadata__\" is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) return fail(fmt::format("\"__metadata__\".\"{}\" is not a string", key));
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    auto parsed = parse_entry(name, entry);
    if (!parsed.ok()) return fail(parsed.status().message());
    entries.emplace_back(parsed->second, std::move(parsed->first));
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  uint64_t covered = 0;  // the data is covered up to here
  for (auto& [offsets, tensor] : entries) {
    const auto [begin, end] = offsets;
    if (begin != covered) {
      return fail(fmt::format("tensor \"{}\" starts at byte {} of the data, where {} was expected ({})",
                              tensor.name, begin, covered,
                              begin < covered ? "it overlaps the one before" : "a hole is left"));
    }
    if (end > data_bytes) {
      return fail(fmt::format("truncated: tensor \"{}\" ends at byte {} of the data, which has {}",
                              tensor.name, end, data_bytes));
    }
    tensor.data = std::span<const std::byte>(file.bytes_).subspan(data_start + begin, end - begin);
    covered = end;
    file.tensors_.push_back(std::move(tensor));
  }
  if (covered != data_bytes) {
    return fail(fmt::format("{} bytes after the last tensor belong to none", data_bytes - covered));
  }
  return file;
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const Tensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return Status::invalid_argument(
          fmt::format("{}: tensor name \"{}\" is empty, reserved or repeated", path, t.name));
    }
    uint64_t bytes = dtype_bytes(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    if (bytes != t.data.size()) {
      return Status::invalid_argument(fmt::format(
          "{}: tensor \"{}\" has {} bytes of data, its shape needs {}", path, t.name, t.data.size(), bytes));
    }
    header[t.name] = {
        {"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string content;
  content.reserve(kLengthBytes + header_text.size() + offset);
  for (size_t i = 0; i < kLengthBytes; ++i)
    content.push_back(static_cast<char>(header_text.size() >> (8 * i)));
  content += header_text;
  for (const TensorToWrite& t : tensors)
    content.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  return write_file_atomically(path, content);
}

}  // namespace crescent::model
