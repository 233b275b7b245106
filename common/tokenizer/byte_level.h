// GPT-2 byte-level helpers shared by the tokenizer: the byte <-> unicode mapping used to spell token
// strings in GGUF/HF vocabularies, and small UTF-8 utilities.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ds::tok {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to
// themselves, the other 68 bytes to U+0100.. in increasing byte order. The "canonical order" is
// the order of that construction (printable bytes first), which is also the id order of the 256
// base tokens in GPT-2-style vocabularies.
uint32_t ByteToCodepoint(uint8_t b);
std::optional<uint8_t> CodepointToByte(uint32_t cp);
const std::array<uint8_t, 256>& BytesInCanonicalOrder();

// Raw bytes -> GPT-2 spelling (UTF-8 of the mapped code points).
std::string BytesToGpt2(std::string_view bytes);
// GPT-2 spelling -> raw bytes; nullopt if the text is not valid UTF-8 or contains a code point
// outside the mapping's image.
std::optional<std::string> Gpt2ToBytes(std::string_view text);

void AppendUtf8(uint32_t cp, std::string* out);
// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 if s[i..] does not start
// with a complete well-formed sequence (invalid lead/continuation, overlong, surrogate, > U+10FFFF,
// or truncated).
int ValidUtf8SeqLen(std::string_view s, size_t i);
// Decodes one well-formed sequence (caller checked ValidUtf8SeqLen > 0).
uint32_t DecodeUtf8(std::string_view s, size_t i, int len);

}  // namespace ds::tok

namespace ds::tok {

// Appends `in` to `out` as well-formed UTF-8, replacing each maximal ill-formed subpart (Unicode
// §3.9 "U+FFFD substitution of maximal subparts") with U+FFFD. When `final` is false a trailing
// sequence that is a valid but incomplete prefix is not consumed. Returns bytes consumed.
size_t AppendSanitizedUtf8(std::string_view in, bool final, std::string* out);

}  // namespace ds::tok
