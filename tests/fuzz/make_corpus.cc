// Writes the GGUF fuzz seed corpus: make_corpus <dir> (normally tests/fuzz/corpus/gguf).
#include <cstdio>
#include <fstream>

#include "tests/fuzz/gguf_corpus_gen.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output dir>\n", argv[0]);
    return 2;
  }
  for (const auto& [name, bytes] : ds::gguf::testing::MakeGgufCorpus()) {
    const std::string path = std::string(argv[1]) + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
  }
  return 0;
}
