// Python's formatting rules, as chat templates see them. Hugging Face renders a model's chat
// template with jinja2 in Python, so what the model was trained on is Python's `str.strip()`,
// `str(value)` and `json.dumps(value, ensure_ascii=False)` (transformers replaces jinja's own
// `tojson`, which sorts keys and HTML-escapes, by that call). A native renderer that must match
// those bytes uses these functions instead of nlohmann's own dump or <cctype>.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ds::py {

// str.strip() / lstrip() / rstrip() without arguments: Unicode whitespace (str.isspace) on UTF-8.
std::string_view Strip(std::string_view s);
std::string_view LStrip(std::string_view s);
std::string_view RStrip(std::string_view s);
// str.lstrip(chars) / rstrip(chars) with an ASCII set.
std::string_view LStripChars(std::string_view s, std::string_view chars);
std::string_view RStripChars(std::string_view s, std::string_view chars);

// repr(float): shortest round-trip digits, scientific when the exponent is < -4 or >= 16
// ("1e-05", "1e+16", "0.0001", "3.0").
std::string FloatRepr(double v);

// json.dumps(v, ensure_ascii=False): ", " and ": " separators, key order as stored (use
// ordered_json), non-ASCII kept, control characters escaped as Python does.
std::string JsonDumps(const nlohmann::ordered_json& v);

// str(v) for a scalar: strings raw, True/False/None, ints in decimal, floats by FloatRepr;
// containers as Python would print them is not needed by the templates (they use tojson).
std::string Str(const nlohmann::ordered_json& v);

}  // namespace ds::py
