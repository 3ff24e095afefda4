#include "text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <memory>
#include <span>

#include "core/error.h"

namespace tandem {

// ---- the regex lists ---------------------------------------------------------------------------
// Written as PCRE2 patterns; code points outside ASCII are spelled \x{...} so that no editor or
// Unicode normalisation can silently change a range bound.

// DeepSeek-V3 / R1: digits in groups of at most three; runs of CJK ideographs and kana; then the
// GPT-4-like word rule (one ASCII punctuation mark may lead a run of ASCII letters, one other
// non-letter may lead a letter run, punctuation runs keep one leading space and the newlines
// after them, whitespace before a word stays with the whitespace run minus its last character).
constexpr std::string_view kDeepseekV3[] = {
    R"(\p{N}{1,3})",
    R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+)"
    R"(|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)",
};

// The cased letters (Unicode Lu, Ll, Lt) that DeepSeek-LLM's pre-tokenizer lists explicitly.
// The list is the vocabulary's definition, not Unicode's: it leaves some cased letters out (for
// example lowercase Armenian), and those must stay out to split the same way.
#define TANDEM_DEEPSEEK_LLM_LETTERS                                                                 \
  R"(A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"           \
  R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"     \
  R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"           \
  R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"        \
  R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"        \
  R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})" \
  R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"                 \
  R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC})"        \
  R"(\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128})"           \
  R"(\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E})"         \
  R"(\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3})"          \
  R"(\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E})"        \
  R"(\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"        \
  R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2})"                 \
  R"(\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943})"

// Hangul syllables and a wide CJK block (U+0800..U+4E00 covers kana, bopomofo, CJK symbols...).
#define TANDEM_DEEPSEEK_CJK R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)"

// DeepSeek-LLM (V2, V2-Lite, V2.5): every CR and LF alone; cased-letter words with one leading
// whitespace; ASCII and full-width punctuation runs with one leading whitespace; trailing
// whitespace; CJK runs; digit runs of any length.
constexpr std::string_view kDeepseekLlm[] = {
    R"([\r\n])",
    R"(\s?[)" TANDEM_DEEPSEEK_LLM_LETTERS R"(]+)",
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
    R"(\s+$)",
    TANDEM_DEEPSEEK_CJK,
    R"(\p{N}+)",
};

// DeepSeek-Coder (V1): like DeepSeek-LLM with Unicode letter and punctuation classes, and every
// digit alone.
constexpr std::string_view kDeepseekCoder[] = {
    R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", TANDEM_DEEPSEEK_CJK, R"(\p{N})",
};

#undef TANDEM_DEEPSEEK_LLM_LETTERS
#undef TANDEM_DEEPSEEK_CJK

// Qwen2 / Qwen3 (`qwen2`): English contractions, a word with at most one leading non-letter,
// every digit alone, punctuation runs with one leading space and the newlines after them, then
// the whitespace rules of the GPT-4 family. Written with explicit cases where the tokenizer's own
// pattern has (?i:...) around the contractions: the same matches.
#define TANDEM_QWEN2_CONTRACTIONS R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
constexpr std::string_view kQwen2[] = {
    TANDEM_QWEN2_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                              R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};

// GLM-4 / GLM-4.5 (`glm4`): Qwen2's rules with digits in groups of at most three.
constexpr std::string_view kGlm4[] = {
    TANDEM_QWEN2_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
                              R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};
#undef TANDEM_QWEN2_CONTRACTIONS

// o200k (gpt-oss, GPT-4o: `gpt-4o`), as the vocabulary defines it: a word is an optional leading
// non-letter, then upper-case-like letters and lower-case-like letters (combining marks count as
// either, so a word keeps its accents) with an optional contraction; digits in groups of at most
// three; punctuation runs keep one leading space and the newlines or slashes after them.
// (llama.cpp's rewrite of this pattern leaves out the marks; the fixtures accept either answer on
// the words where that differs.)
#define TANDEM_O200K_UPPER R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])"
#define TANDEM_O200K_LOWER R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])"
#define TANDEM_O200K_CONTRACTION R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
constexpr std::string_view kO200k[] = {
    R"([^\r\n\p{L}\p{N}]?)" TANDEM_O200K_UPPER "*" TANDEM_O200K_LOWER "+" TANDEM_O200K_CONTRACTION
    R"(|[^\r\n\p{L}\p{N}]?)" TANDEM_O200K_UPPER "+" TANDEM_O200K_LOWER "*" TANDEM_O200K_CONTRACTION
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};
#undef TANDEM_O200K_UPPER
#undef TANDEM_O200K_LOWER

// Kimi-K2 (`kimi-k2`): runs of Han characters first, then o200k's word rules over letters that
// are not Han (the tokenizer writes the class intersection [...&&[^\p{Han}]], which PCRE2 spells
// as a lookahead per character), digits in threes, and its punctuation and whitespace rules.
#define TANDEM_KIMI_UPPER R"((?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))"
#define TANDEM_KIMI_LOWER R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}]))"
constexpr std::string_view kKimiK2[] = {
    R"(\p{Han}+)"
    R"(|[^\r\n\p{L}\p{N}]?)" TANDEM_KIMI_UPPER "*" TANDEM_KIMI_LOWER "+" TANDEM_O200K_CONTRACTION
    R"(|[^\r\n\p{L}\p{N}]?)" TANDEM_KIMI_UPPER "+" TANDEM_KIMI_LOWER "*" TANDEM_O200K_CONTRACTION
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};
#undef TANDEM_KIMI_UPPER
#undef TANDEM_KIMI_LOWER
#undef TANDEM_O200K_CONTRACTION

struct NamedRegexList {
  std::string_view name;
  std::span<const std::string_view> patterns;
};

constexpr std::array<NamedRegexList, 7> kRegexLists = {{
    {"deepseek-v3", kDeepseekV3},
    {"deepseek-llm", kDeepseekLlm},
    {"deepseek-coder", kDeepseekCoder},
    {"qwen2", kQwen2},
    {"gpt-4o", kO200k},
    {"glm4", kGlm4},
    {"kimi-k2", kKimiK2},
}};

// ---- compiled regexes --------------------------------------------------------------------------

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;  // for error messages

  ~Regex() { pcre2_code_free(code); }
};

std::shared_ptr<const PreTokenizer::Regex> PreTokenizer::compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // UCP: \s, \d and \w follow Unicode properties, as in the reference implementations.
  // MATCH_INVALID_UTF: invalid UTF-8 in the subject is skipped over instead of failing the match.
  // DOLLAR_ENDONLY: `$` means the end of the piece only, never "before a final newline".
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    // Our own patterns: a failure here is a bug (or a PCRE2 without Unicode support).
    fail("pre-tokenizer regex /{}/ does not compile at offset {}: {}", pattern, error_offset,
         reinterpret_cast<const char*>(message.data()));
  }
  auto regex = std::make_shared<PreTokenizer::Regex>();
  regex->code = code;
  regex->pattern = std::string(pattern);
  // JIT makes matching several times faster; where it is unavailable the interpreter is used.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return regex;
}

PreTokenizer PreTokenizer::for_name(std::string_view name) {
  for (const NamedRegexList& list : kRegexLists) {
    if (list.name != name) continue;
    PreTokenizer pre;
    pre.name_ = std::string(name);
    for (std::string_view pattern : list.patterns) pre.regexes_.push_back(compile(pattern));
    return pre;
  }
  fail("pre-tokenizer '{}' is not supported; supported: {}", name,
       fmt::join(supported_names(), ", "));
}

const std::vector<std::string>& PreTokenizer::supported_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const NamedRegexList& list : kRegexLists) out.emplace_back(list.name);
    return out;
  }();
  return names;
}

std::vector<TextSpan> PreTokenizer::split(std::string_view text) const {
  std::vector<TextSpan> out;
  split(text, out);
  return out;
}

void PreTokenizer::split(std::string_view text, std::vector<TextSpan>& out) const {
  out.clear();
  if (text.empty()) return;
  out.push_back({0, text.size()});
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  if (!match) throw std::bad_alloc();
  std::vector<TextSpan> next;
  for (const auto& regex : regexes_) {
    next.clear();
    for (const TextSpan piece : out) {
      // The piece alone is the subject, so anchors and lookaheads stop at its ends.
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.offset);
      size_t done = 0;  // bytes of the piece already emitted
      while (done < piece.size) {
        // None of the patterns can match the empty string; NOTEMPTY makes that a guarantee, so
        // the loop always advances.
        int rc = pcre2_match(regex->code, subject, piece.size, done, PCRE2_NOTEMPTY, match.get(),
                             nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // a pathological input: the interpreter copes
          rc = pcre2_match(regex->code, subject, piece.size, done, PCRE2_NOTEMPTY | PCRE2_NO_JIT,
                           match.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          std::array<PCRE2_UCHAR, 256> message{};
          pcre2_get_error_message(rc, message.data(), message.size());
          fail("pre-tokenizer '{}': matching /{}/ failed on a {}-byte piece: {}", name_,
               regex->pattern, piece.size, reinterpret_cast<const char*>(message.data()));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t begin = ovector[0], end = ovector[1];
        TANDEM_CHECK(begin >= done && end > begin && end <= piece.size);
        if (begin > done) next.push_back({piece.offset + done, begin - done});  // the gap
        next.push_back({piece.offset + begin, end - begin});
        done = end;
      }
      if (done < piece.size) next.push_back({piece.offset + done, piece.size - done});
    }
    out.swap(next);
  }
}

}  // namespace tandem
