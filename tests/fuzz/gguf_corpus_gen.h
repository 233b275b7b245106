// Seed corpus for the GGUF fuzzer: small valid files covering every value type and several tensor
// types ("valid_*"), plus truncated/corrupt ones ("bad_*"). make_corpus writes them to
// tests/fuzz/corpus/gguf/; gguf_test checks the committed copies still match this generator.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "common/gguf/gguf.h"
#include "tests/gguf/raw_gguf.h"

namespace ds::gguf::testing {

inline Writer::Fill CorpusFill(int seed) {
  return [seed](uint8_t* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i * 13 + seed);
  };
}

inline std::vector<uint8_t> MustWrite(const Writer& w) {
  auto img = w.WriteToMemory();
  return img.ok() ? std::move(*img) : std::vector<uint8_t>{};
}

inline std::vector<std::pair<std::string, std::vector<uint8_t>>> MakeGgufCorpus() {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  auto V = [](ValueType t, auto x) { return Value{t, x}; };
  auto A = [](ValueType et, std::vector<Value> items) {
    return Value{ValueType::ARRAY, Array{et, std::move(items)}};
  };

  {
    Writer w;
    out.emplace_back("valid_empty.gguf", MustWrite(w));
  }
  {
    Writer w;
    w.AddValue("s.u8", V(ValueType::U8, uint64_t{250}));
    w.AddValue("s.i8", V(ValueType::I8, int64_t{-3}));
    w.AddValue("s.u16", V(ValueType::U16, uint64_t{65535}));
    w.AddValue("s.i16", V(ValueType::I16, int64_t{-300}));
    w.AddU32("s.u32", 123456);
    w.AddI32("s.i32", -123456);
    w.AddF32("s.f32", 1e-6f);
    w.AddBool("s.bool", true);
    w.AddString("s.string", "hello \xe4\xb8\x96");
    w.AddU64("s.u64", ~0ull);
    w.AddValue("s.i64", V(ValueType::I64, int64_t{-(1ll << 50)}));
    w.AddValue("s.f64", V(ValueType::F64, 2.5));
    out.emplace_back("valid_scalars.gguf", MustWrite(w));
  }
  {
    Writer w;
    w.AddValue("a.u8",
               A(ValueType::U8, {V(ValueType::U8, uint64_t{1}), V(ValueType::U8, uint64_t{2})}));
    w.AddValue("a.i16", A(ValueType::I16, {V(ValueType::I16, int64_t{-7})}));
    w.AddI32Array("a.i32", {11, 11, 10, 0});
    w.AddF32Array("a.f32", {0.5f, -1.0f});
    w.AddValue("a.bool", A(ValueType::BOOL, {V(ValueType::BOOL, true), V(ValueType::BOOL, false)}));
    w.AddStringArray("a.string", {"a", "", "Ġb"});
    w.AddValue("a.u64", A(ValueType::U64, {V(ValueType::U64, uint64_t{1} << 63)}));
    w.AddValue("a.f64", A(ValueType::F64, {}));
    w.AddValue("a.nested",
               A(ValueType::ARRAY, {A(ValueType::STRING, {V(ValueType::STRING, std::string("x"))}),
                                    A(ValueType::ARRAY, {A(ValueType::I8, {})})}));
    out.emplace_back("valid_arrays.gguf", MustWrite(w));
  }
  {
    Writer w;
    w.AddString("general.architecture", "qwen35");
    w.AddTensor("f32", {8}, GgmlType::F32, CorpusFill(1));
    w.AddTensor("f16", {4, 3}, GgmlType::F16, CorpusFill(2));
    w.AddTensor("bf16", {2, 2, 2, 2}, GgmlType::BF16, CorpusFill(3));
    out.emplace_back("valid_tensors_float.gguf", MustWrite(w));
  }
  {
    Writer w;
    w.AddTensor("q8_0", {32, 2}, GgmlType::Q8_0, CorpusFill(4));
    w.AddTensor("q4_k", {256}, GgmlType::Q4_K, CorpusFill(5));
    w.AddTensor("q6_k", {256}, GgmlType::Q6_K, CorpusFill(6));
    w.AddTensor("iq4_xs", {256}, GgmlType::IQ4_XS, CorpusFill(7));
    w.AddTensor("q4_0", {32}, GgmlType::Q4_0, CorpusFill(8));
    out.emplace_back("valid_tensors_quant.gguf", MustWrite(w));
  }
  {
    Writer w;
    w.SetAlignment(64);
    w.AddU32("general.file_type", 1);
    w.AddTensor("a", {3}, GgmlType::F32, CorpusFill(9));
    w.AddTensor("b", {5, 2}, GgmlType::F16, CorpusFill(10));
    out.emplace_back("valid_align64.gguf", MustWrite(w));
  }
  {
    Writer w;
    w.AddString("general.architecture", "qwen35");
    w.AddU32("qwen35.block_count", 1);
    w.AddU32("qwen35.embedding_length", 32);
    w.AddF32("qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    w.AddF32("qwen35.rope.freq_base", 1e7f);
    w.AddI32Array("qwen35.rope.dimension_sections", {11, 11, 10, 0});
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab", "<|im_end|>"});
    w.AddI32Array("tokenizer.ggml.token_type", {1, 1, 1, 3});
    w.AddStringArray("tokenizer.ggml.merges", {"a b"});
    w.AddU32("tokenizer.ggml.eos_token_id", 3);
    w.AddBool("tokenizer.ggml.add_bos_token", false);
    w.AddTensor("token_embd.weight", {32, 4}, GgmlType::F16, CorpusFill(11));
    w.AddTensor("output_norm.weight", {32}, GgmlType::F32, CorpusFill(12));
    w.AddTensor("blk.0.attn_qkv.weight", {32, 8}, GgmlType::Q8_0, CorpusFill(13));
    out.emplace_back("valid_qwen35_tiny.gguf", MustWrite(w));
  }
  {
    auto v2 = MustWrite([&] {
      Writer w;
      w.AddU32("x", 1);
      w.AddTensor("t", {4}, GgmlType::F32, CorpusFill(14));
      return w;
    }());
    v2[4] = 2;  // version field
    out.emplace_back("valid_v2.gguf", std::move(v2));
  }
  {
    RawGguf r;  // tensor infos not in data order
    r.Header(2, 0).TensorInfo("late", {8}, 0, 96).TensorInfo("early", {32, 2}, 8, 0);
    r.PadTo(32).Fill(128);
    out.emplace_back("valid_unordered_offsets.gguf", r.bytes());
  }

  const auto& qwen = out[6].second;
  out.emplace_back("bad_truncated_header.gguf",
                   std::vector<uint8_t>(qwen.begin(), qwen.begin() + 13));
  out.emplace_back("bad_truncated_metadata.gguf",
                   std::vector<uint8_t>(qwen.begin(), qwen.begin() + qwen.size() / 3));
  out.emplace_back("bad_truncated_data.gguf", std::vector<uint8_t>(qwen.begin(), qwen.end() - 1));
  {
    auto img = qwen;
    img[1] = 'X';
    out.emplace_back("bad_magic.gguf", std::move(img));
  }
  {
    RawGguf r;
    r.Header(0, 1).Key("arr", 9).U32(4).U64(1ull << 60).U32(1).U32(2);
    out.emplace_back("bad_huge_array.gguf", r.bytes());
  }
  {
    RawGguf r;
    r.Header(1, 0).TensorInfo("w", {256}, 99, 0).PadTo(32).Fill(1024);
    out.emplace_back("bad_unknown_ggml_type.gguf", r.bytes());
  }
  {
    RawGguf r;
    r.Header(2, 0).TensorInfo("a", {8}, 0, 0).TensorInfo("b", {8}, 0, 0).PadTo(32).Fill(64);
    out.emplace_back("bad_overlap.gguf", r.bytes());
  }
  {
    RawGguf r;
    r.Header(1, 1).KvU32("general.alignment", 48).TensorInfo("w", {4}, 0, 0).PadTo(64).Fill(64);
    out.emplace_back("bad_alignment.gguf", r.bytes());
  }
  {
    RawGguf r;
    r.Header(0, 1).Key("deep", 9);
    for (int d = 0; d < 12; ++d) r.U32(9).U64(1);
    r.U32(0).U64(0);
    out.emplace_back("bad_deep_nesting.gguf", r.bytes());
  }
  return out;
}

}  // namespace ds::gguf::testing
