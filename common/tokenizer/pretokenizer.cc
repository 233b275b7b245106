#include "common/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/tokenizer/byte_level.h"

namespace ds::tok {
namespace {

// \s and \S are spelled out as the Unicode White_Space property (what llama.cpp's unicode tables
// and the HF Rust regex use). PCRE2's UCP \s is "Z categories + \t\n\v\f\r", which misses U+0085.
constexpr const char kWs[] =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";

std::string Expand(std::string_view tmpl) {
  // Template placeholders: "\s" -> [ws], "\S" -> [^ws], "[^\s" -> "[^ws" (inside a class).
  std::string out;
  const std::string ws(kWs);
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl.compare(i, 4, "[^\\s") == 0) {
      out += "[^" + ws;
      i += 3;
    } else if (tmpl.compare(i, 2, "\\s") == 0) {
      out += "[" + ws + "]";
      i += 1;
    } else if (tmpl.compare(i, 2, "\\S") == 0) {
      out += "[^" + ws + "]";
      i += 1;
    } else {
      out.push_back(tmpl[i]);
    }
  }
  return out;
}

// llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2 / QWEN35 (spec §9.5). The HF form writes the contractions
// as (?i:'s|'t|...), which is the same set for ASCII.
constexpr const char kQwen2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char kQwen35[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

}  // namespace

struct PreTokenizer::Code {
  pcre2_code* re = nullptr;
  bool jit = false;
  ~Code() {
    if (re) pcre2_code_free(re);
  }
};

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<PreTokenizer> PreTokenizer::Create(std::string_view name) {
  const char* tmpl = nullptr;
  if (name == "qwen2") {
    tmpl = kQwen2;
  } else if (name == "qwen35") {
    tmpl = kQwen35;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.pre: unsupported pre-tokenizer '", std::string(name), "' (supported: qwen2, qwen35)"));
  }
  PreTokenizer p;
  p.name_ = std::string(name);
  p.pattern_ = Expand(tmpl);
  p.code_ = std::make_unique<Code>();
  int err = 0;
  PCRE2_SIZE err_off = 0;
  p.code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.pattern_.data()), p.pattern_.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (p.code_->re == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return absl::InternalError(absl::StrCat("pre-tokenizer ", std::string(name), ": regex compile failed at ",
                                            err_off, ": ", reinterpret_cast<const char*>(msg)));
  }
  // JIT is an optimisation only; the interpreter gives identical results.
  p.code_->jit = pcre2_jit_compile(p.code_->re, PCRE2_JIT_COMPLETE) == 0;
  return p;
}

absl::Status PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* out) const {
  struct MatchData {
    pcre2_match_data* md;
    ~MatchData() { pcre2_match_data_free(md); }
  } md{pcre2_match_data_create_from_pattern(code_->re, nullptr)};
  if (md.md == nullptr) return absl::ResourceExhaustedError("pre-tokenizer: out of memory");

  size_t i = 0;
  while (i < text.size()) {
    // Maximal well-formed UTF-8 run [i, j).
    size_t j = i;
    while (j < text.size()) {
      int len = ValidUtf8SeqLen(text, j);
      if (len == 0) break;
      j += static_cast<size_t>(len);
    }
    if (j == i) {
      // Maximal run of bytes that do not start a well-formed sequence.
      while (j < text.size() && ValidUtf8SeqLen(text, j) == 0) ++j;
      out->push_back(text.substr(i, j - i));
      i = j;
      continue;
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + i);
    const size_t n = j - i;
    size_t pos = 0;
    while (pos < n) {
      int rc = pcre2_match(code_->re, subject, n, pos, PCRE2_NO_UTF_CHECK, md.md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(code_->re, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.md,
                         nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) {
        // Cannot happen with these patterns (every code point is covered); keep the rest whole.
        out->push_back(text.substr(i + pos, n - pos));
        break;
      }
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return absl::ResourceExhaustedError(absl::StrCat("pre-tokenizer ", name_, ": match at byte ",
                                                         i + pos, " failed: ",
                                                         reinterpret_cast<const char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
      size_t s = ov[0], e = ov[1];
      if (s > pos) out->push_back(text.substr(i + pos, s - pos));  // unmatched gap, kept whole
      if (e == s) {
        // Empty match (not produced by these patterns): advance one code point.
        e = s + static_cast<size_t>(ValidUtf8SeqLen(text, i + s));
        out->push_back(text.substr(i + s, e - s));
      } else {
        out->push_back(text.substr(i + s, e - s));
      }
      pos = e;
    }
    i = j;
  }
  return absl::OkStatus();
}

}  // namespace ds::tok
