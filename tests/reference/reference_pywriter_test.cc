// Reads the file written by `gguf_writer.py --selftest` (ctest fixture reference_pywriter_generate)
// with ds::gguf::File: the Python writer that exports tiny_ref.gguf must produce what our reader
// (and llama.cpp's layout, spec §9.1) expects. Expected values mirror selftest_writer() there.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/gguf/gguf.h"
#include "common/util/half.h"
#include "kernels/cpu/quant.h"

namespace ds::gguf {
namespace {

class PyWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = File::Open(DS_PYWRITER_GGUF);
    ASSERT_TRUE(f.ok()) << f.status() << " (run via ctest: the fixture writes the file)";
    file_ = std::move(*f);
  }
  std::unique_ptr<File> file_;
};

TEST_F(PyWriterTest, ScalarsKeepTheirTypes) {
  const File& f = *file_;
  auto type_of = [&](const char* k) { return f.Find(k) ? f.Find(k)->type : ValueType(999); };
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(type_of("test.u8"), ValueType::U8);
  EXPECT_EQ(type_of("test.i8"), ValueType::I8);
  EXPECT_EQ(type_of("test.u16"), ValueType::U16);
  EXPECT_EQ(type_of("test.i16"), ValueType::I16);
  EXPECT_EQ(type_of("test.u32"), ValueType::U32);
  EXPECT_EQ(type_of("test.i32"), ValueType::I32);
  EXPECT_EQ(type_of("test.f32"), ValueType::F32);
  EXPECT_EQ(type_of("test.bool_true"), ValueType::BOOL);
  EXPECT_EQ(type_of("test.string"), ValueType::STRING);
  EXPECT_EQ(type_of("test.u64"), ValueType::U64);
  EXPECT_EQ(type_of("test.i64"), ValueType::I64);
  EXPECT_EQ(type_of("test.f64"), ValueType::F64);
  EXPECT_EQ(*f.GetUInt("test.u8"), 200u);
  EXPECT_EQ(*f.GetInt("test.i8"), -100);
  EXPECT_EQ(*f.GetUInt("test.u16"), 60000u);
  EXPECT_EQ(*f.GetInt("test.i16"), -30000);
  EXPECT_EQ(*f.GetUInt("test.u32"), 4000000000u);
  EXPECT_EQ(*f.GetInt("test.i32"), -2000000000);
  EXPECT_EQ(*f.GetFloat("test.f32"), static_cast<double>(1.5e-6f));
  EXPECT_TRUE(*f.GetBool("test.bool_true"));
  EXPECT_FALSE(*f.GetBool("test.bool_false"));
  EXPECT_EQ(*f.GetString("test.string"), "h\xC3\xA9llo \xE2\x9C\x93");
  EXPECT_EQ(*f.GetUInt("test.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(*f.GetInt("test.i64"), -(int64_t{1} << 62) - 7);
  EXPECT_EQ(*f.GetFloat("test.f64"), -2.5e300);
  EXPECT_EQ(*f.GetString("general.architecture"), "pytest");
}

TEST_F(PyWriterTest, Arrays) {
  const File& f = *file_;
  EXPECT_EQ(*f.GetIntArray("test.arr_i32"), (std::vector<int64_t>{3, 3, 2, 0, -7}));
  EXPECT_EQ(std::get<Array>(f.Find("test.arr_i32")->v).elem_type, ValueType::I32);
  EXPECT_EQ(*f.GetFloatArray("test.arr_f32"), (std::vector<float>{0.5f, -1.25f, 3.0f}));
  EXPECT_EQ(*f.GetStringArray("test.arr_str"), (std::vector<std::string>{"a", "", "c d"}));
  EXPECT_EQ(*f.GetIntArray("test.arr_u8"), (std::vector<int64_t>{1, 2, 255}));
  const Value* nested = f.Find("test.arr_nested");
  ASSERT_NE(nested, nullptr);
  const auto& outer = std::get<Array>(nested->v);
  ASSERT_EQ(outer.elem_type, ValueType::ARRAY);
  ASSERT_EQ(outer.items.size(), 2u);
  EXPECT_EQ(std::get<Array>(outer.items[0].v).items.size(), 2u);
  EXPECT_EQ(std::get<Array>(outer.items[1].v).items.size(), 1u);
}

TEST_F(PyWriterTest, TensorsAreAlignedAndExact) {
  const File& f = *file_;
  ASSERT_EQ(f.tensors().size(), 3u);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;

  const TensorInfo* t32 = f.FindTensor("t.f32");
  ASSERT_NE(t32, nullptr);
  EXPECT_EQ(t32->type, GgmlType::F32);
  EXPECT_EQ(t32->n_dims, 2);
  EXPECT_EQ(t32->ne[0], 5);
  EXPECT_EQ(t32->ne[1], 3);
  for (int i = 0; i < 15; ++i) {
    float v;
    std::memcpy(&v, t32->data + 4 * i, 4);
    EXPECT_EQ(v, 0.25f * i - 1.0f) << i;
  }

  const TensorInfo* t16 = f.FindTensor("t.f16");
  ASSERT_NE(t16, nullptr);
  EXPECT_EQ(t16->type, GgmlType::F16);
  std::vector<float> row(8);
  cpu::DequantizeRow(GgmlType::F16, t16->data, row.data(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(row[i], 0.5f * i - 2.0f) << i;

  const TensorInfo* q8 = f.FindTensor("t.q8_0");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->type, GgmlType::Q8_0);
  EXPECT_EQ(q8->nbytes, 4u * 34u);
  std::vector<float> q(64);
  for (int r = 0; r < 2; ++r) {
    cpu::DequantizeRow(GgmlType::Q8_0, q8->data + r * q8->row_bytes(), q.data(), 64);
    for (int i = 0; i < 64; ++i) {
      const int b = r * 2 + i / 32, j = i % 32;
      const float expect = std::ldexp(1.0f, -(b + 1)) * static_cast<float>((7 * j + 3 * b) % 255 - 127);
      EXPECT_EQ(q[i], expect) << "row " << r << " elem " << i;
    }
  }
}

}  // namespace
}  // namespace ds::gguf
