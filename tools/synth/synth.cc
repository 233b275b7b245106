// Synthetic qwen35 GGUF writer (see synth.h).
#include "tools/synth/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/half.h"
#include "common/util/thread_pool.h"
#include "kernels/cpu/quant.h"

namespace ds {

SynthOptions SynthOptions::Tiny() { return SynthOptions{}; }

SynthOptions SynthOptions::Qwen27B() {
  SynthOptions o;
  o.n_layer = 64;
  o.n_embd = 5120;
  o.n_ff = 17408;
  o.n_head = 24;
  o.n_head_kv = 4;
  o.head_dim = 256;
  o.n_rot = 64;
  o.gdn_k_heads = 16;
  o.gdn_v_heads = 48;
  o.gdn_k_dim = 128;
  o.gdn_v_dim = 128;
  o.conv_kernel = 4;
  o.interval = 4;
  o.n_vocab = 248320;
  o.ctx_train = 262144;
  o.with_mtp = true;
  o.weight_type = GgmlType::Q6_K;
  o.tokenizer = SynthTokenizer::kTinyBpe;
  return o;
}

namespace {

// ---- Deterministic PRNG: splitmix64 streams keyed by (seed, tensor name, row).
inline uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t Hash(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  uint64_t st = h;
  return SplitMix(st);
}
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t Next() { return SplitMix(s); }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double Normal() {  // Box-Muller
    const double u1 = std::max(Uniform(), 1e-300), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

enum class Init { kMatrix, kNorm, kSsmA, kDtBias, kConv };

struct TensorSpec {
  SynthTensor t;
  Init init = Init::kMatrix;
};

// Weight type of a matrix whose rows have `cols` elements (see SynthOptions::weight_type).
GgmlType MatrixType(GgmlType want, int64_t cols) {
  const auto& wi = GgmlInfo(want);
  if (cols % wi.block_elems == 0) return want;
  if (wi.block_elems > 1 && cols % 32 == 0) return GgmlType::Q8_0;
  return GgmlType::F16;
}

absl::Status Validate(const SynthOptions& o) {
  auto pos = [](const char* n, int v) -> absl::Status {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat("SynthOptions.", n, " = ", v, " must be >= 1"));
    return absl::OkStatus();
  };
  DS_RETURN_IF_ERROR(pos("n_layer", o.n_layer));
  DS_RETURN_IF_ERROR(pos("n_embd", o.n_embd));
  DS_RETURN_IF_ERROR(pos("n_ff", o.n_ff));
  DS_RETURN_IF_ERROR(pos("n_head", o.n_head));
  DS_RETURN_IF_ERROR(pos("n_head_kv", o.n_head_kv));
  DS_RETURN_IF_ERROR(pos("head_dim", o.head_dim));
  DS_RETURN_IF_ERROR(pos("n_rot", o.n_rot));
  DS_RETURN_IF_ERROR(pos("gdn_k_heads", o.gdn_k_heads));
  DS_RETURN_IF_ERROR(pos("gdn_v_heads", o.gdn_v_heads));
  DS_RETURN_IF_ERROR(pos("gdn_k_dim", o.gdn_k_dim));
  DS_RETURN_IF_ERROR(pos("gdn_v_dim", o.gdn_v_dim));
  DS_RETURN_IF_ERROR(pos("conv_kernel", o.conv_kernel));
  DS_RETURN_IF_ERROR(pos("interval", o.interval));
  DS_RETURN_IF_ERROR(pos("ctx_train", o.ctx_train));
  if (o.n_head % o.n_head_kv)
    return absl::InvalidArgumentError("SynthOptions.n_head must be a multiple of n_head_kv");
  if (o.gdn_v_heads % o.gdn_k_heads)
    return absl::InvalidArgumentError("SynthOptions.gdn_v_heads must be a multiple of gdn_k_heads");
  if (o.n_rot % 2 || o.n_rot > o.head_dim)
    return absl::InvalidArgumentError("SynthOptions.n_rot must be even and <= head_dim");
  const GgmlTypeInfo* ti = FindGgmlType(static_cast<uint32_t>(o.weight_type));
  if (!ti || !ti->supported)
    return absl::InvalidArgumentError(absl::StrCat("SynthOptions.weight_type ",
                                                   static_cast<uint32_t>(o.weight_type), " is not supported"));
  if (o.n_vocab < 0) return absl::InvalidArgumentError("SynthOptions.n_vocab must be >= 0");
  return absl::OkStatus();
}

int ResolveVocab(const SynthOptions& o, TokenizerData* tok) {
  if (o.tokenizer == SynthTokenizer::kNone) {
    if (tok) {
      *tok = TokenizerData{};
      tok->model = "none";
    }
    return o.n_vocab > 0 ? o.n_vocab : 256;
  }
  TokenizerData t = MakeTinyBpe(o.tiny_bpe_merges);
  const int base = static_cast<int>(t.tokens.size());
  const int n = std::max(o.n_vocab, (base + 63) / 64 * 64);
  if (tok) {
    // Rows the tokenizer does not define are [PAD<id>] of type UNUSED, as llama.cpp's converter.
    for (int id = base; id < n; ++id) {
      t.tokens.push_back(absl::StrCat("[PAD", id, "]"));
      t.token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
    }
    *tok = std::move(t);
  }
  return n;
}

std::vector<TensorSpec> PlanTensors(const SynthOptions& o, int n_vocab) {
  std::vector<TensorSpec> v;
  auto add = [&](std::string name, std::vector<int64_t> ne, GgmlType type, Init init) {
    TensorSpec s;
    s.t.name = std::move(name);
    s.t.ne = std::move(ne);
    s.t.type = type;
    int64_t rows = 1;
    for (size_t i = 1; i < s.t.ne.size(); ++i) rows *= s.t.ne[i];
    s.t.nbytes = GgmlRowBytes(type, s.t.ne[0]) * static_cast<uint64_t>(rows);
    s.init = init;
    v.push_back(std::move(s));
  };
  auto mat = [&](const std::string& name, int64_t in, int64_t out) {
    add(name, {in, out}, MatrixType(o.weight_type, in), Init::kMatrix);
  };
  auto vec = [&](const std::string& name, int64_t n, Init init) {
    add(name, {n}, GgmlType::F32, init);
  };
  const int64_t H = o.n_embd, hd = o.head_dim;
  const int64_t Kw = static_cast<int64_t>(o.gdn_k_heads) * o.gdn_k_dim;
  const int64_t Vw = static_cast<int64_t>(o.gdn_v_heads) * o.gdn_v_dim;
  const int64_t C = 2 * Kw + Vw;
  mat("token_embd.weight", H, n_vocab);
  vec("output_norm.weight", H, Init::kNorm);
  if (!o.tied_output) mat("output.weight", H, n_vocab);
  auto attn_layer = [&](const std::string& p) {
    vec(p + "attn_norm.weight", H, Init::kNorm);
    mat(p + "attn_q.weight", H, 2 * o.n_head * hd);
    mat(p + "attn_k.weight", H, o.n_head_kv * hd);
    mat(p + "attn_v.weight", H, o.n_head_kv * hd);
    mat(p + "attn_output.weight", o.n_head * hd, H);
    vec(p + "attn_q_norm.weight", hd, Init::kNorm);
    vec(p + "attn_k_norm.weight", hd, Init::kNorm);
  };
  auto ffn = [&](const std::string& p) {
    vec(p + "post_attention_norm.weight", H, Init::kNorm);
    mat(p + "ffn_gate.weight", H, o.n_ff);
    mat(p + "ffn_up.weight", H, o.n_ff);
    mat(p + "ffn_down.weight", o.n_ff, H);
  };
  for (int i = 0; i < o.n_layer; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    if ((i + 1) % o.interval == 0) {
      attn_layer(p);
    } else {
      vec(p + "attn_norm.weight", H, Init::kNorm);
      mat(p + "attn_qkv.weight", H, C);
      mat(p + "attn_gate.weight", H, Vw);
      add(p + "ssm_conv1d.weight", {o.conv_kernel, C}, GgmlType::F32, Init::kConv);
      vec(p + "ssm_dt.bias", o.gdn_v_heads, Init::kDtBias);
      vec(p + "ssm_a", o.gdn_v_heads, Init::kSsmA);
      if (o.alpha_beta_f32) {
        add(p + "ssm_alpha.weight", {H, o.gdn_v_heads}, GgmlType::F32, Init::kMatrix);
        add(p + "ssm_beta.weight", {H, o.gdn_v_heads}, GgmlType::F32, Init::kMatrix);
      } else {
        mat(p + "ssm_alpha.weight", H, o.gdn_v_heads);
        mat(p + "ssm_beta.weight", H, o.gdn_v_heads);
      }
      vec(p + "ssm_norm.weight", o.gdn_v_dim, Init::kNorm);
      mat(p + "ssm_out.weight", Vw, H);
    }
    ffn(p);
  }
  if (o.with_mtp) {
    const std::string p = absl::StrCat("blk.", o.n_layer, ".");
    attn_layer(p);
    ffn(p);
    mat(p + "nextn.eh_proj.weight", 2 * H, H);
    vec(p + "nextn.enorm.weight", H, Init::kNorm);
    vec(p + "nextn.hnorm.weight", H, Init::kNorm);
    vec(p + "nextn.shared_head_norm.weight", H, Init::kNorm);
  }
  return v;
}

// One row of `n` f32 values for the given init.
void GenFloats(Init init, Rng& rng, int64_t n, int64_t in_dim, int K, float* dst) {
  switch (init) {
    case Init::kMatrix: {
      const double sd = 1.0 / std::sqrt(static_cast<double>(in_dim));
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(rng.Normal() * sd);
      break;
    }
    case Init::kNorm:  // effective multiplier near 1 (GGUF convention, +1 baked in)
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(1.0 + 0.1 * rng.Normal());
      break;
    case Init::kSsmA:  // -exp(A_log), A_log ~ U(-2, 1.5)
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(-std::exp(-2.0 + 3.5 * rng.Uniform()));
      break;
    case Init::kDtBias:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(-2.0 + 3.0 * rng.Uniform());
      break;
    case Init::kConv: {
      const double sd = 1.0 / std::sqrt(static_cast<double>(K));
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(rng.Normal() * sd);
      break;
    }
  }
}

// ---- Random-block generation: random bytes with the block's f16 scale set (the 27B-shape files
// in seconds instead of quantizing 27B f32 weights; Q4_K / Q5_K's cost ~40 CPU-minutes).
bool RandomBlockType(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::Q6_K || t == GgmlType::IQ4_NL ||
         t == GgmlType::IQ4_XS || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
}
// Q4_K / Q5_K: d * sc * q - dmin * m with random 6-bit sc, m and 4- / 5-bit q; dmin = d * the mean
// of q (7.5 / 15.5) makes the weights zero-mean like the symmetric types'.
float KquantDminRatio(GgmlType t) {
  return t == GgmlType::Q4_K ? 7.5f : t == GgmlType::Q5_K ? 15.5f : 0.f;
}
// Offset of the fp16 super-scale d inside a block, and whether its sign is randomised (types whose
// other fields cannot flip the sign need it, so the weights are zero-mean).
void ScaleField(GgmlType t, int* off, bool* random_sign) {
  *random_sign = false;
  *off = 0;
  if (t == GgmlType::Q6_K) *off = 208;
  if (t == GgmlType::Q8_0 || t == GgmlType::IQ4_NL) *random_sign = true;
}
void FillRandomBlocks(GgmlType t, Rng& rng, uint8_t* dst, int64_t n_blocks, float d) {
  const int bb = GgmlInfo(t).block_bytes;
  const int64_t total = n_blocks * bb;
  int64_t i = 0;
  for (; i + 8 <= total; i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(dst + i, &r, 8);
  }
  if (i < total) {
    const uint64_t r = rng.Next();
    std::memcpy(dst + i, &r, total - i);
  }
  int off;
  bool rsign;
  ScaleField(t, &off, &rsign);
  const uint16_t hp = F32ToF16(d), hn = F32ToF16(-d);
  const uint16_t dmin = KquantDminRatio(t) != 0 ? F32ToF16(KquantDminRatio(t) * d) : 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = dst + b * bb;
    // A payload bit decides the sign: cheap and still deterministic.
    const uint16_t h = rsign && (blk[bb - 1] & 1) ? hn : hp;
    std::memcpy(blk + off, &h, 2);
    if (dmin != 0) std::memcpy(blk + 2, &dmin, 2);  // Q4_K / Q5_K: dmin follows d
  }
}
// RMS of dequantized random blocks with d = 1 (computed once per type, fixed seed).
double UnitBlockRms(GgmlType t) {
  const int be = GgmlInfo(t).block_elems;
  const int64_t nb = 512;
  std::vector<uint8_t> buf(nb * GgmlInfo(t).block_bytes);
  Rng rng(12345);
  FillRandomBlocks(t, rng, buf.data(), nb, 1.0f);
  std::vector<float> x(nb * be);
  cpu::DequantizeRow(t, buf.data(), x.data(), nb * be);
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  return std::sqrt(ss / x.size());
}

}  // namespace

uint32_t LlamaFileType(GgmlType t) {  // llama.cpp LLAMA_FTYPE_* (MOSTLY_*)
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q4_K: return 15;
    case GgmlType::Q5_K: return 17;
    case GgmlType::Q6_K: return 18;
    case GgmlType::IQ4_NL: return 25;
    case GgmlType::IQ4_XS: return 30;
    case GgmlType::BF16: return 32;
    default: return 0;
  }
}

void WriteQwen35Metadata(const SynthOptions& o, int n_vocab, const std::string& name,
                         gguf::Writer* w) {
  const std::string a = "qwen35.";
  w->AddString("general.architecture", "qwen35");
  w->AddString("general.name", name);
  w->AddU32("general.file_type", LlamaFileType(o.weight_type));
  w->AddU32("general.quantization_version", 2);
  w->AddU32(a + "block_count", o.n_layer + (o.with_mtp ? 1 : 0));
  if (o.with_mtp) w->AddU32(a + "nextn_predict_layers", 1);
  w->AddU32(a + "context_length", o.ctx_train);
  w->AddU32(a + "embedding_length", o.n_embd);
  w->AddU32(a + "feed_forward_length", o.n_ff);
  w->AddU32(a + "attention.head_count", o.n_head);
  w->AddU32(a + "attention.head_count_kv", o.n_head_kv);
  w->AddU32(a + "attention.key_length", o.head_dim);
  w->AddU32(a + "attention.value_length", o.head_dim);
  w->AddF32(a + "attention.layer_norm_rms_epsilon", o.rms_eps);
  w->AddF32(a + "rope.freq_base", o.rope_base);
  w->AddU32(a + "rope.dimension_count", o.n_rot);
  {
    const int s = o.n_rot / 2;  // 32 pairs -> [11, 11, 10, 0] as the real model
    w->AddI32Array(a + "rope.dimension_sections", {(s + 2) / 3, (s + 1) / 3, s / 3, 0});
  }
  w->AddU32(a + "ssm.conv_kernel", o.conv_kernel);
  w->AddU32(a + "ssm.state_size", o.gdn_k_dim);
  w->AddU32(a + "ssm.group_count", o.gdn_k_heads);
  w->AddU32(a + "ssm.time_step_rank", o.gdn_v_heads);
  w->AddU32(a + "ssm.inner_size", o.gdn_v_heads * o.gdn_v_dim);
  w->AddU32(a + "full_attention_interval", o.interval);
  w->AddU32(a + "vocab_size", n_vocab);
  if (o.write_recurrent_layers) {
    gguf::Value v;
    v.type = gguf::ValueType::ARRAY;
    gguf::Array arr;
    arr.elem_type = gguf::ValueType::BOOL;
    for (int i = 0; i < o.n_layer + (o.with_mtp ? 1 : 0); ++i) {
      gguf::Value e;
      e.type = gguf::ValueType::BOOL;
      e.v = i < o.n_layer && (i + 1) % o.interval != 0;
      arr.items.push_back(std::move(e));
    }
    v.v = std::move(arr);
    w->AddValue(a + "attention.recurrent_layers", std::move(v));
  }
}

absl::StatusOr<SynthPlan> DescribeGguf(const SynthOptions& opts) {
  DS_RETURN_IF_ERROR(Validate(opts));
  SynthPlan plan;
  plan.n_vocab = ResolveVocab(opts, nullptr);
  for (TensorSpec& s : PlanTensors(opts, plan.n_vocab)) {
    plan.tensor_bytes += s.t.nbytes;
    plan.data_bytes = (plan.data_bytes + 31) / 32 * 32 + s.t.nbytes;
    plan.tensors.push_back(std::move(s.t));
  }
  return plan;
}

absl::Status SynthesizeGguf(const SynthOptions& o, const std::string& path) {
  DS_RETURN_IF_ERROR(Validate(o));
  TokenizerData tok;
  const int n_vocab = ResolveVocab(o, &tok);
  if (o.tokenizer == SynthTokenizer::kTinyBpe && o.n_vocab > 0 &&
      o.n_vocab < static_cast<int>(MakeTinyBpe(o.tiny_bpe_merges).tokens.size()))
    return absl::InvalidArgumentError("SynthOptions.n_vocab is smaller than the tiny BPE vocabulary");
  std::vector<TensorSpec> specs = PlanTensors(o, n_vocab);
  uint64_t total = 0;
  for (const auto& s : specs) total += s.t.nbytes;
  const bool random_blocks =
      o.quant_mode == SynthQuantMode::kRandomBlocks ||
      (o.quant_mode == SynthQuantMode::kAuto && total > (512ull << 20));

  gguf::Writer w;
  WriteQwen35Metadata(o, n_vocab,
                      absl::StrCat("deltaserve-synth-", o.n_layer, "L-", o.n_embd, "H-",
                                   std::string(GgmlInfo(o.weight_type).name)),
                      &w);
  WriteTokenizerMetadata(tok, &w);

  auto pool = std::make_shared<ThreadPool>(o.n_threads);
  for (const TensorSpec& s : specs) {
    const SynthTensor t = s.t;
    const Init init = s.init;
    const uint64_t tseed = Hash(t.name, o.seed);
    const int K = o.conv_kernel;
    const bool rb = random_blocks && init == Init::kMatrix && RandomBlockType(t.type);
    w.AddTensor(t.name, t.ne, t.type, [t, init, tseed, K, rb, pool](uint8_t* dst, uint64_t nbytes) {
      const int64_t cols = t.ne[0];
      const int64_t rows = static_cast<int64_t>(nbytes / GgmlRowBytes(t.type, cols));
      const uint64_t row_bytes = GgmlRowBytes(t.type, cols);
      const double d = rb ? (1.0 / std::sqrt(static_cast<double>(cols))) / UnitBlockRms(t.type) : 0;
      pool->ParallelFor(
          rows,
          [&](int64_t r0, int64_t r1) {
            std::vector<float> buf(cols);
            for (int64_t r = r0; r < r1; ++r) {
              uint64_t st = tseed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(r + 1);
              Rng rng(SplitMix(st));
              uint8_t* out = dst + r * row_bytes;
              if (rb) {
                FillRandomBlocks(t.type, rng, out, cols / GgmlInfo(t.type).block_elems,
                                 static_cast<float>(d));
                continue;
              }
              GenFloats(init, rng, cols, cols, K, buf.data());
              if (t.type == GgmlType::F32) {
                std::memcpy(out, buf.data(), cols * 4);
              } else {
                cpu::QuantizeRow(t.type, buf.data(), out, cols);
              }
            }
          },
          /*grain=*/64);
    });
  }
  return w.WriteFile(path);
}

}  // namespace ds
