// The character classes of GPT-2's pre-tokenisation regex: \p{L} (Letter), \p{N} (Number), \s
// (Space) and everything else (Other), for every Unicode code point.
//
// A compact generated table (unicode_classes.cpp, from make_unicode_classes.py) rather than ICU:
// the reference tokenizer (Hugging Face `tokenizers`, through Oniguruma) classifies by Unicode
// 16.0, while Debian 12's ICU 72 knows Unicode 15.0 and would disagree on ~5,000 newer letters;
// a pinned table matches exactly, costs ~900 ranges (10 KB) and no run-time library.
// Surrogates and values above U+10FFFF are Other.
#pragma once

namespace dscpp::data {

enum class CharClass : unsigned char { Other, Letter, Number, Space };

// The Unicode version the table was generated from ("16.0.0").
extern const char* const kUnicodeVersion;

CharClass char_class(char32_t c);

}  // namespace dscpp::data
