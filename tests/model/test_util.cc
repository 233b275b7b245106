#include "tests/model/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "gtest/gtest.h"

namespace ds::testing {

namespace {
// Files created by this process, removed at exit so repeated runs do not fill the temp dir.
struct TempFiles {
  std::mutex mu;
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
};
TempFiles& Temps() {
  static TempFiles t;
  return t;
}
}  // namespace

std::string TempPath(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  std::string dir = d ? d : ::testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir += '/';
  std::string p = dir + "ds_model_test_" + std::to_string(::getpid()) + "_" + name;
  std::lock_guard<std::mutex> lock(Temps().mu);
  Temps().paths.push_back(p);
  return p;
}

std::string SynthPath(const std::string& name, const SynthOptions& o) {
  static std::mutex mu;
  static std::map<std::string, std::string> made;
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find(name);
  if (it != made.end()) return it->second;
  const std::string path = TempPath(name + ".gguf");
  absl::Status s = SynthesizeGguf(o, path);
  EXPECT_TRUE(s.ok()) << s;
  made[name] = path;
  return path;
}

const std::string& TinyModelPath() {
  static const std::string p = SynthPath("tiny", SynthOptions::Tiny());
  return p;
}

absl::Status Rewrite(const std::string& src, const std::string& dst,
                     const std::function<bool(const std::string&, gguf::Value&)>& edit_kv,
                     const std::function<bool(TensorEdit&)>& edit_tensor) {
  DS_ASSIGN_OR_RETURN(auto f, gguf::File::Open(src));
  gguf::Writer w;
  for (const auto& [key, value] : f->metadata()) {
    if (key == "general.alignment") continue;
    gguf::Value v = value;
    if (edit_kv && !edit_kv(key, v)) continue;
    w.AddValue(key, v);
  }
  for (const auto& t : f->tensors()) {
    TensorEdit e{t.name, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.type};
    if (edit_tensor && !edit_tensor(e)) continue;
    uint64_t rows = 1;
    for (size_t i = 1; i < e.ne.size(); ++i) rows *= e.ne[i];
    const uint64_t n = GgmlRowBytes(e.type, e.ne[0]) * rows;
    std::vector<uint8_t> bytes(n, 0);
    std::memcpy(bytes.data(), t.data, std::min<uint64_t>(n, t.nbytes));
    w.AddTensorBytes(e.name, e.ne, e.type, std::move(bytes));
  }
  return w.WriteFile(dst);
}

}  // namespace ds::testing
