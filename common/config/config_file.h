// Config files under /etc/deltaserve/ (deploy/config/*.conf): `key = value` lines that map one to
// one onto a role's command-line flags (key `max_inflight` is flag `--max-inflight`), so there is a
// single parser and a single set of defaults per role.
//
//   # comment (whole lines only; '#' inside a value is kept)
//   listen = 0.0.0.0:50051
//   api_key_file = /etc/deltaserve/api-keys
//   model = "/var/lib/deltaserve/models/qwen 3.5.gguf"   # quotes keep spaces; \" and \\ escape
//
// `--config FILE` may appear anywhere on the command line and may repeat; its pairs are inserted
// where it stands, so flags after it override it (roles keep the last value of a flag). Errors name
// the file and line; errors of the role's own flag parser are rewritten to name them too.
#pragma once
#include <optional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace ds::config {

struct Entry {
  std::string key;    // as written: [a-z][a-z0-9_]*
  std::string value;  // unquoted
  int line = 0;       // 1-based
};

struct ConfigFile {
  std::string path;
  std::vector<Entry> entries;  // file order; keys are unique
};

// Syntax only: `key = value` lines, comments, blank lines, quoting; duplicate keys and empty
// values are errors (a forgotten value must not silently become a default).
absl::StatusOr<ConfigFile> Parse(std::string_view text, const std::string& path);
absl::StatusOr<ConfigFile> Load(const std::string& path);

// "max_inflight" -> "--max-inflight".
std::string FlagForKey(std::string_view key);

// A role's "--flag value" pairs (the last value wins); a flag outside `known` is an error, so a
// typo never falls back to a default.
absl::StatusOr<std::map<std::string, std::string>> ParseFlagPairs(
    int argc, char** argv, const std::set<std::string>& known);

// An on|off switch of ParseFlagPairs' result: sets *value when `flag` is present, leaves it as it
// is when not; anything but on or off is "FLAG expects on or off, got 'V'".
absl::Status OnOffFlag(const std::map<std::string, std::string>& flags, const std::string& flag,
                       bool* value);

// A command line with every `--config FILE` expanded, plus where each flag came from.
class Args {
 public:
  // Expands argv[0..argc) (a role's flags, without the program and role names).
  static absl::StatusOr<Args> Expand(int argc, char** argv);

  // Removes every `flag value` pair (command line or config file) and returns the last value,
  // nullopt when absent: for flags every role shares (--log-level, --metrics-listen), handled
  // before the role's own parser sees the rest.
  absl::StatusOr<std::optional<std::string>> Take(const std::string& flag);

  int argc() const { return static_cast<int>(args_.size()); }
  // Pointers into args(); valid until the next non-const call (rebuilt on every call, so an Args
  // may be copied or moved freely).
  char** argv() {
    Rebuild();
    return ptrs_.data();
  }
  const std::vector<std::string>& args() const { return args_; }
  bool from_config() const { return !origins_.empty(); }

  // Rewrites an error of the role's flag parser that names a flag taken from a config file
  // ("unknown flag '--listn'", "--max-inflight expects an integer ...") so it names the key and
  // file:line instead; other errors are returned unchanged.
  absl::Status Explain(const absl::Status& s) const;

 private:
  struct Origin {
    std::string key, where;  // "max_inflight", "/etc/deltaserve/gateway.conf:7"
  };
  void Rebuild();

  std::vector<std::string> args_;
  std::vector<int> origin_of_;  // parallel to args_: index into origins_, -1 = command line
  std::vector<char*> ptrs_;
  std::vector<Origin> origins_;
};

}  // namespace ds::config
