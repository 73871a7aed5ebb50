#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void spill(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// A file laid out by hand as the format's documentation describes it, not by write_safetensors.
std::string hand_made(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>(header.size() >> (8 * i));
  return out + header + data;
}

TEST(Safetensors, WhatIsWrittenReadsBackWithItsShapesTypesBytesAndMetadata) {
  test::TempDir dir;
  const std::vector<float> a{1, 2, 3, 4, 5, 6};
  const std::vector<uint16_t> b{0x3f80, 0x4000, 0xbf80, 0};  // bf16 1, 2, -1, 0
  const std::vector<TensorToWrite> tensors{
      {.name = "a", .dtype = DType::kF32, .shape = {2, 3}, .data = bytes_of(a)},
      {.name = "b.weight", .dtype = DType::kBF16, .shape = {4}, .data = std::as_bytes(std::span(b))}};
  ASSERT_TRUE(write_safetensors(dir.file("m.safetensors"), tensors, {{"format", "pt"}}).ok());
  auto file = SafetensorsFile::read(dir.file("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->tensors().size(), 2u);
  const Tensor* ta = file->find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::kF32);
  EXPECT_THAT(ta->shape, ElementsAre(2, 3));
  EXPECT_EQ(ta->elements(), 6);
  ASSERT_EQ(ta->data.size(), 24u);
  EXPECT_EQ(std::memcmp(ta->data.data(), a.data(), 24), 0);
  const Tensor* tb = file->find("b.weight");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(tb->data.data(), b.data(), 8), 0);
  EXPECT_EQ(file->find("c"), nullptr);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  // The data starts 8-byte aligned in the file (the header is padded with spaces).
  const std::string raw = slurp(dir.file("m.safetensors"));
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < 8; ++i)
    header_bytes |= static_cast<uint64_t>(static_cast<unsigned char>(raw[i])) << (8 * i);
  EXPECT_EQ(header_bytes % 8, 0u);
}

TEST(Safetensors, ReadsAFileLaidOutByHand) {
  test::TempDir dir;
  const float values[2] = {0.5f, -2.0f};
  std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  spill(dir.file("h.safetensors"),
        hand_made(R"({"x":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})",
                  data));
  auto file = SafetensorsFile::read(dir.file("h.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  const Tensor* x = file->find("x");
  ASSERT_NE(x, nullptr);
  float read[2];
  std::memcpy(read, x->data.data(), 8);
  EXPECT_EQ(read[0], 0.5f);
  EXPECT_EQ(read[1], -2.0f);
  EXPECT_EQ(file->metadata().at("k"), "v");
}

// Every way a file can be wrong gets one error that names the file and what is wrong.
TEST(Safetensors, ABrokenFileIsRefusedWithWhatIsWrong) {
  test::TempDir dir;
  const std::string eight(8, 'x'), sixteen(16, 'x');
  const std::string two =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  struct Case {
    std::string name, content, expected;
  };
  const std::vector<Case> cases{
      {"short", "abc", "truncated: 3 bytes"},
      {"header", hand_made(two, sixteen).substr(0, 20), "truncated: the header says"},
      {"data", hand_made(two, sixteen.substr(0, 12)),
       "truncated: tensor \"b\" ends at byte 16 of the data, which has 12"},
      {"json", hand_made("[1, 2]", ""), "the header is not a JSON object"},
      {"dtype", hand_made(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", eight),
       "tensor \"a\": dtype \"F64\" is not supported"},
      {"size", hand_made(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       "hold 8 bytes, but shape [3] of F32 needs 12"},
      {"offsets", hand_made(R"({"a":{"dtype":"F32","shape":[2]}})", eight), "\"data_offsets\" is missing"},
      {"hole", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", sixteen),
       "a hole is left"},
      {"overlap",
       hand_made(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           eight),
       "it overlaps the one before"},
      {"trailing", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", sixteen),
       "8 bytes after the last tensor belong to none"},
      {"shape", hand_made(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       "not a count"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name + ".safetensors");
    spill(path, c.content);
    auto file = SafetensorsFile::read(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(file.status().message(), HasSubstr(path + ": "));
    EXPECT_THAT(file.status().message(), HasSubstr(c.expected));
  }
  auto missing = SafetensorsFile::read(dir.file("none.safetensors"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, WritingRefusesDataOfTheWrongSizeAndRepeatedNamesAndLeavesNoFile) {
  test::TempDir dir;
  const std::vector<float> three{1, 2, 3};
  const std::vector<TensorToWrite> wrong{
      {.name = "a", .dtype = DType::kF32, .shape = {2, 2}, .data = bytes_of(three)}};
  Status s = write_safetensors(dir.file("w.safetensors"), wrong);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"a\" has 12 bytes of data, its shape needs 16"));
  const std::vector<TensorToWrite> twice{
      {.name = "a", .dtype = DType::kF32, .shape = {3}, .data = bytes_of(three)},
      {.name = "a", .dtype = DType::kF32, .shape = {3}, .data = bytes_of(three)}};
  EXPECT_EQ(write_safetensors(dir.file("w.safetensors"), twice).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.safetensors")));
}

}  // namespace
}  // namespace crescent::model
