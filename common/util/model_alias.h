// Model names that stand for files: `--model demo` is the trained demo model committed with the
// sources (models/demo/README.md). Every command that takes a model file resolves it here.
#pragma once
#include <string>

namespace ds {

// The committed demo model's path inside the source tree.
inline constexpr const char kDemoModelRelPath[] = "models/demo/demo-f16.gguf";

// "demo" -> the demo model: the copy under the source tree this binary was built from if it exists,
// else models/demo/... relative to the working directory (an unpacked release). Anything else is
// returned unchanged (a path).
std::string ResolveModelAlias(const std::string& model);

}  // namespace ds
