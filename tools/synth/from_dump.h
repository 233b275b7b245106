// Trained-model exporter: a qwen35 GGUF from the f32 tensors that tools/train/train.py dumps
// (`deltaserve gguf-from-dump`). The dump is already in GGUF conventions (spec/model.md §9.6: norm
// weights are the effective multipliers, ssm_a = -exp(A_log), ssm_conv1d is {K, C}, value heads in
// the tiled order), so export is a copy plus quantization; the loader's expectations are checked,
// not re-derived: every tensor the model shape needs (DescribeGguf) must be in the dump with the
// same shape, and nothing else may be.
//
// Dump layout: DIR/manifest.txt, lines
//   deltaserve-dump 1
//   meta <key> <value>                 shape keys named as SynthOptions fields (n_layer, n_embd, ...),
//                                      or general.<key> <text> copied as a string
//   tensor <name> <file> <byte offset> <ne0> [<ne1> ...]   little-endian f32, ne0 contiguous
// and the data files it names (split so each stays small enough to carry).
#pragma once
#include <string>

#include "common/gguf/ggml_types.h"
#include "common/util/status.h"

namespace ds {

struct DumpExportOptions {
  std::string dump_dir;
  std::string vocab_path;                // GGUF holding tokenizer.ggml.* (deltaserve bpe-train)
  GgmlType weight_type = GgmlType::F32;  // matrices; 1-D, conv and alpha/beta stay F32
  int n_threads = 0;                     // quantization threads (0 = all cores)
};

absl::Status ExportDumpToGguf(const DumpExportOptions& opts, const std::string& out_path);

}  // namespace ds
