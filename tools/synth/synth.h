// Synthetic qwen35 GGUF files with random, well-scaled weights (any shape, any supported weight
// type), for tests, benchmarks and the CUDA-vs-CPU comparisons. Deterministic from the seed: every
// tensor (and every row of it) has its own PRNG stream derived from (seed, tensor name, row), so
// generation order and parallelism do not change the bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds {
namespace gguf {
class Writer;
}  // namespace gguf

enum class SynthTokenizer { kNone, kTinyBpe };

enum class SynthQuantMode {
  kAuto,            // random blocks when the file is larger than 512 MiB, else quantize floats
  kQuantizeFloats,  // normal(0, 1/sqrt(in)) floats through ds::cpu::QuantizeRow (exact reference)
  kRandomBlocks,    // random payload bytes + calibrated fp16 scale (fast; Q8_0 Q6_K IQ4_NL IQ4_XS Q4_K Q5_K)
};

struct SynthOptions {
  // Shape (spec/model.md §1 names).
  int n_layer = 4;        // trunk layers
  int n_embd = 128;
  int n_ff = 256;
  int n_head = 4;
  int n_head_kv = 2;
  int head_dim = 32;
  int n_rot = 8;
  int gdn_k_heads = 2;
  int gdn_v_heads = 6;
  int gdn_k_dim = 16;
  int gdn_v_dim = 16;
  int conv_kernel = 4;
  int interval = 4;       // layer i is attention iff (i+1) % interval == 0
  int n_vocab = 0;        // 0: the tokenizer's size rounded up to 64 (kNone: 256)
  int ctx_train = 4096;
  bool with_mtp = true;
  bool tied_output = false;            // omit output.weight (lm head = token_embd)
  bool write_recurrent_layers = false; // also write qwen35.attention.recurrent_layers
  // Store ssm_alpha / ssm_beta ({n_embd, Hv}) as F32 whatever weight_type is, as llama.cpp's
  // quantizer does (this is what makes the all-Q6_K 27B file 20.95 GiB, shared/ANCHORS.md).
  bool alpha_beta_f32 = true;
  float rope_base = 1e7f;
  float rms_eps = 1e-6f;
  // Matrices use weight_type when their row length is a multiple of its block size, else Q8_0
  // (quantized types, rows multiple of 32) or F16. 1-D tensors and ssm_conv1d are always F32.
  GgmlType weight_type = GgmlType::F32;
  SynthQuantMode quant_mode = SynthQuantMode::kAuto;
  uint64_t seed = 1;
  SynthTokenizer tokenizer = SynthTokenizer::kTinyBpe;
  int tiny_bpe_merges = 200;
  int n_threads = 0;      // generation threads (0 = all cores)

  static SynthOptions Tiny();     // 4 layers (3 GDN + 1 attention) + MTP, hidden 128, F32
  static SynthOptions Qwen27B();  // exact 27B shape (§1), vocab 248320, MTP, Q6_K matrices
};

struct SynthTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  GgmlType type = GgmlType::F32;
  uint64_t nbytes = 0;
};

struct SynthPlan {
  std::vector<SynthTensor> tensors;  // in file order
  int n_vocab = 0;
  uint64_t tensor_bytes = 0;         // sum of nbytes
  uint64_t data_bytes = 0;           // data section incl. 32-byte alignment padding
};

// The tensor list a SynthesizeGguf call would write, without generating anything (dry run).
absl::StatusOr<SynthPlan> DescribeGguf(const SynthOptions& opts);

// Writes the general.* and qwen35.* keys of a model of shape `o` with `n_vocab` embedding rows
// (shared by the synthetic writer and the trained-model exporter, tools/synth/from_dump.h).
void WriteQwen35Metadata(const SynthOptions& o, int n_vocab, const std::string& name,
                         gguf::Writer* w);
// llama.cpp's general.file_type (LLAMA_FTYPE_MOSTLY_*) for a file whose matrices are `t`.
uint32_t LlamaFileType(GgmlType t);

// Writes the GGUF file. Errors name the bad option or the I/O failure.
absl::Status SynthesizeGguf(const SynthOptions& opts, const std::string& path);

}  // namespace ds
