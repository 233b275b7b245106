#include "common/util/model_alias.h"

#include <filesystem>

namespace ds {

std::string ResolveModelAlias(const std::string& model) {
  if (model != "demo") return model;
#ifdef DS_SOURCE_DIR
  const std::string in_tree = std::string(DS_SOURCE_DIR) + "/" + kDemoModelRelPath;
  std::error_code ec;
  if (std::filesystem::exists(in_tree, ec)) return in_tree;
#endif
  return kDemoModelRelPath;
}

}  // namespace ds
