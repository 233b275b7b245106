#include "common/config/config_file.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace ds::config {
namespace {

bool ValidKey(std::string_view k) {
  if (k.empty() || !(k[0] >= 'a' && k[0] <= 'z')) return false;
  for (char c : k)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// A quoted value: "..." with \" and \\ escapes; anything after the closing quote must be a comment.
absl::StatusOr<std::string> Unquote(absl::string_view v, const std::string& where) {
  std::string out;
  size_t i = 1;
  for (; i < v.size(); ++i) {
    if (v[i] == '\\' && i + 1 < v.size() && (v[i + 1] == '"' || v[i + 1] == '\\')) {
      out.push_back(v[++i]);
    } else if (v[i] == '"') {
      break;
    } else {
      out.push_back(v[i]);
    }
  }
  if (i >= v.size()) return absl::InvalidArgumentError(where + ": unterminated quoted value");
  absl::string_view rest = absl::StripAsciiWhitespace(v.substr(i + 1));
  if (!rest.empty() && rest[0] != '#')
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unexpected text after the quoted value: '", rest, "'"));
  return out;
}

}  // namespace

std::string FlagForKey(std::string_view key) {
  return "--" + absl::StrReplaceAll(absl::string_view(key.data(), key.size()), {{"_", "-"}});
}

absl::StatusOr<ConfigFile> Parse(std::string_view text, const std::string& path) {
  ConfigFile f;
  f.path = path;
  std::set<std::string> seen;
  int line_no = 0;
  std::istringstream in{std::string(text)};
  std::string raw;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string where = absl::StrCat(path, ":", line_no);
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos)
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected 'key = value', got '", line, "'"));
    const std::string key(absl::StripAsciiWhitespace(line.substr(0, eq)));
    absl::string_view rawv = absl::StripAsciiWhitespace(line.substr(eq + 1));
    if (!ValidKey(key))
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": bad key '", key, "' (lower case letters, digits and '_', e.g. max_inflight)"));
    std::string value;
    if (!rawv.empty() && rawv[0] == '"') {
      DS_ASSIGN_OR_RETURN(value, Unquote(rawv, where));
    } else {
      // An unquoted value ends at " #" (a trailing comment).
      if (size_t c = rawv.find(" #"); c != absl::string_view::npos)
        rawv = absl::StripAsciiWhitespace(rawv.substr(0, c));
      value = std::string(rawv);
      if (value.empty())
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": key '", key, "' has no value (delete the line to use the default)"));
    }
    if (!seen.insert(key).second)
      return absl::InvalidArgumentError(absl::StrCat(where, ": key '", key, "' set twice"));
    f.entries.push_back({key, std::move(value), line_no});
  }
  return f;
}

absl::StatusOr<ConfigFile> Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

absl::StatusOr<Args> Args::Expand(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (f != "--config") {
      a.args_.push_back(f);
      a.origin_of_.push_back(-1);
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag --config needs a file");
    DS_ASSIGN_OR_RETURN(ConfigFile cf, Load(argv[++i]));
    for (const Entry& e : cf.entries) {
      const std::string flag = FlagForKey(e.key);
      if (flag == "--config")
        return absl::InvalidArgumentError(
            absl::StrCat(cf.path, ":", e.line, ": config files do not include other files"));
      const int origin = static_cast<int>(a.origins_.size());
      a.origins_.push_back({e.key, absl::StrCat(cf.path, ":", e.line)});
      a.args_.push_back(flag);
      a.args_.push_back(e.value);
      a.origin_of_.push_back(origin);
      a.origin_of_.push_back(origin);
    }
  }
  a.Rebuild();
  return a;
}

absl::StatusOr<std::map<std::string, std::string>> ParseFlagPairs(
    int argc, char** argv, const std::set<std::string>& known) {
  std::map<std::string, std::string> m;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (!known.count(f)) return absl::InvalidArgumentError("unknown flag '" + f + "'");
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + f + " needs a value");
    m[f] = argv[++i];
  }
  return m;
}

absl::Status OnOffFlag(const std::map<std::string, std::string>& flags, const std::string& flag,
                       bool* value) {
  const auto it = flags.find(flag);
  if (it == flags.end()) return absl::OkStatus();
  if (it->second != "on" && it->second != "off")
    return absl::InvalidArgumentError(flag + " expects on or off, got '" + it->second + "'");
  *value = it->second == "on";
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> Args::Take(const std::string& flag) {
  std::optional<std::string> value;
  std::vector<std::string> args;
  std::vector<int> origin_of;
  for (size_t i = 0; i < args_.size(); ++i) {
    if (args_[i] != flag) {
      args.push_back(args_[i]);
      origin_of.push_back(origin_of_[i]);
      continue;
    }
    if (i + 1 >= args_.size()) return absl::InvalidArgumentError("flag " + flag + " needs a value");
    value = args_[++i];
  }
  args_ = std::move(args);
  origin_of_ = std::move(origin_of);
  Rebuild();
  return value;
}

void Args::Rebuild() {
  ptrs_.clear();
  for (std::string& s : args_) ptrs_.push_back(s.data());
}

absl::Status Args::Explain(const absl::Status& s) const {
  if (s.ok() || origins_.empty()) return s;
  const std::string msg(s.message());
  // Candidate flags: every flag position (a value never starts with "--" in our configs' keys).
  // The value in force is the last occurrence, as in the role parsers; only when that one came
  // from a file is the error rewritten.
  for (size_t i = args_.size(); i-- > 0;) {
    const std::string& flag = args_[i];
    if (flag.rfind("--", 0) != 0) continue;
    bool later = false;
    for (size_t j = i + 1; j < args_.size(); ++j) later |= args_[j] == flag;
    if (later || origin_of_[i] < 0) continue;
    const Origin& o = origins_[static_cast<size_t>(origin_of_[i])];
    if (msg == absl::StrCat("unknown flag '", flag, "'"))
      return absl::Status(s.code(), absl::StrCat(o.where, ": unknown key '", o.key, "'"));
    // Exact flag name followed by a non-name character (so --slot does not match --slots).
    for (size_t p = msg.find(flag); p != std::string::npos; p = msg.find(flag, p + 1)) {
      const size_t end = p + flag.size();
      if (end < msg.size() &&
          (absl::ascii_isalnum(static_cast<unsigned char>(msg[end])) || msg[end] == '-'))
        continue;
      const std::string named =
          absl::StrReplaceAll(msg, {{flag, absl::StrCat("key '", o.key, "'")}});
      return absl::Status(s.code(), absl::StrCat(o.where, ": ", named));
    }
  }
  return s;
}

}  // namespace ds::config
