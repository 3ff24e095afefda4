#include "text/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "text/byte_unicode.h"
#include "text/utf8_scan.h"

namespace tandem {

namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Fibonacci hashing of a merge pair onto a power-of-two table.
size_t pair_slot(uint64_t pair, size_t mask) {
  return size_t((pair * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

uint32_t text_hash(std::string_view text) {
  return uint32_t(std::hash<std::string_view>{}(text));
}

// The byte each code point of the byte alphabet stands for (the alphabet uses code points
// below 256 + 68); -1 for the rest. A table, because decoding 129k tokens asks it millions
// of times.
std::array<int16_t, 324> make_alphabet_bytes() {
  std::array<int16_t, 324> table;
  table.fill(-1);
  for (int b = 0; b < 256; ++b) table[size_t(byte_to_codepoint(uint8_t(b)))] = int16_t(b);
  return table;
}

// What a token written in the byte alphabet decodes to. A character outside the alphabet is
// kept as its own UTF-8 (hand-added tokens are sometimes written as plain text).
void append_alphabet_bytes(std::string_view text, const std::array<int16_t, 324>& table,
                           std::string& out) {
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = scan_utf8_char(text.substr(pos));
    if (c.kind == Utf8Char::Kind::Complete && c.codepoint < table.size() && table[c.codepoint] >= 0)
      out += char(table[c.codepoint]);
    else
      out.append(text.substr(pos, c.size));
    pos += c.size;
  }
}

// An optional token-id key; present, it must name a token.
std::optional<int32_t> read_token_id(const gguf::GgufFile& file, std::string_view key,
                                     size_t n_vocab) {
  if (file.find(key) == nullptr) return std::nullopt;
  const int64_t id = file.get_int(key);
  if (id < 0 || uint64_t(id) >= n_vocab)
    fail("{}: metadata key '{}' is {}, outside the vocabulary of {} tokens", file.name(), key, id,
         n_vocab);
  return int32_t(id);
}

}  // namespace

// Buffers reused across the pieces of one encode() call.
struct Tokenizer::EncodeScratch {
  // One symbol per byte of the piece at first; a merge folds the right symbol into the left.
  struct Symbol {
    int32_t token;  // -1 once merged away
    int32_t prev;   // index of the previous live symbol, -1 at the start
    int32_t next;   // index of the next live symbol, -1 at the end
  };
  // A pair of neighbours that a merge applies to, as it was when queued. It is stale (skipped)
  // if either side has changed since: merges only ever grow a symbol, so an unchanged token id
  // on both sides means the pair is still there.
  struct Candidate {
    int32_t rank;
    int32_t left;  // symbol index
    int32_t left_token, right_token, merged_token;
    // Lowest rank first; among equal ranks (the same pair twice) the leftmost.
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };

  std::vector<TextSpan> spans;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// ---- loading -----------------------------------------------------------------------------------

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& file) {
  const std::string& name = file.name();
  if (file.find(kModelKey) == nullptr)
    fail("{}: no tokenizer in this file (metadata key '{}' is missing)", name, kModelKey);
  const std::string model = file.get_string(kModelKey);
  if (model != "gpt2")
    fail(
        "{}: tokenizer model '{}' ({}) is not supported; tandem supports 'gpt2' (byte-level BPE, "
        "as DeepSeek models use)",
        name, model, kModelKey);
  if (file.find(kPreKey) == nullptr)
    fail("{}: metadata key '{}' is missing, so the pre-tokenizer is unknown; supported: {}", name,
         kPreKey, fmt::join(PreTokenizer::supported_names(), ", "));
  const std::string pre_name = file.get_string(kPreKey);
  std::optional<PreTokenizer> pre;
  try {
    pre = PreTokenizer::for_name(pre_name);
  } catch (const Error& e) {
    fail("{}: {} ({})", name, e.what(), kPreKey);
  }
  Tokenizer tok(std::move(*pre));

  // Tokens.
  const gguf::Array& tokens = file.get_array(kTokensKey, gguf::ValueType::String);
  const size_t n_vocab = tokens.items.size();
  if (n_vocab == 0) fail("{}: metadata key '{}' is an empty array", name, kTokensKey);
  if (n_vocab > size_t(std::numeric_limits<int32_t>::max()))
    fail("{}: metadata key '{}' has {} tokens, more than ids can number", name, kTokensKey,
         n_vocab);
  tok.text_offsets_.reserve(n_vocab + 1);
  tok.text_offsets_.push_back(0);
  for (const gguf::Value& token : tokens.items) {
    tok.texts_.append(*token.as_string());
    tok.text_offsets_.push_back(tok.texts_.size());
  }
  tok.build_text_index();

  // Token types: optional (all normal without them), but a present array must match.
  tok.token_types_.assign(n_vocab, TokenType::Normal);
  if (file.find(kTypesKey) != nullptr) {
    const gguf::Array& types = file.get_array(kTypesKey);
    if (types.items.size() != n_vocab)
      fail("{}: metadata key '{}' has {} entries but '{}' has {} tokens", name, kTypesKey,
           types.items.size(), kTokensKey, n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) {
      const std::optional<int64_t> type = types.items[i].as_int();
      if (!type || *type < 0 || *type > int64_t(TokenType::Byte))
        fail("{}: metadata key '{}' entry {} ({}) is not a token type 0..6", name, kTypesKey, i,
             types.items[i].to_display());
      tok.token_types_[i] = TokenType(*type);
    }
  }

  // What each token decodes to, and the single-byte tokens BPE starts from.
  static const std::array<int16_t, 324> alphabet = make_alphabet_bytes();
  tok.byte_offsets_.reserve(n_vocab + 1);
  tok.byte_offsets_.push_back(0);
  tok.bytes_.reserve(tok.texts_.size());
  for (size_t i = 0; i < n_vocab; ++i) {
    const TokenType type = tok.token_types_[i];
    // Special tokens are written as plain text, not in the byte alphabet.
    const bool plain = type == TokenType::Control || type == TokenType::UserDefined ||
                       type == TokenType::Unknown || type == TokenType::Unused;
    const std::string_view text = tok.text_of(int32_t(i));
    if (plain)
      tok.bytes_.append(text);
    else
      append_alphabet_bytes(text, alphabet, tok.bytes_);
    tok.byte_offsets_.push_back(tok.bytes_.size());
  }
  for (int b = 0; b < 256; ++b)
    tok.byte_token_[size_t(b)] =
        tok.find_token(utf8_encode(byte_to_codepoint(uint8_t(b)))).value_or(-1);

  // Merges: "LEFT RIGHT", rank = index. Both parts and their concatenation must be tokens.
  if (file.find(kMergesKey) == nullptr)
    fail("{}: metadata key '{}' is missing; a byte-level BPE vocabulary needs its merges", name,
         kMergesKey);
  const gguf::Array& merges = file.get_array(kMergesKey, gguf::ValueType::String);
  tok.merge_table_.resize(std::bit_ceil(std::max<size_t>(16, 2 * merges.items.size())));
  const auto token_id = [&](std::string_view text, size_t index, std::string_view merge) {
    const std::optional<int32_t> id = tok.find_token(text);
    if (!id)
      fail("{}: metadata key '{}' entry {} ('{}') needs token '{}', which is not in '{}'", name,
           kMergesKey, index, merge, text, kTokensKey);
    return *id;
  };
  std::string joined;
  for (size_t i = 0; i < merges.items.size(); ++i) {
    const std::string& merge = *merges.items[i].as_string();
    // Token texts in the byte alphabet contain no spaces; search from 1 all the same, so that
    // a first part that is itself " " still splits right.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 == merge.size())
      fail("{}: metadata key '{}' entry {} ('{}') is not two tokens separated by a space", name,
           kMergesKey, i, merge);
    const std::string_view left(merge.data(), space),
        right(merge.data() + space + 1, merge.size() - space - 1);
    // The parts first: a merge of an unknown token is the more telling message.
    const int32_t left_id = token_id(left, i, merge), right_id = token_id(right, i, merge);
    joined.assign(left);
    joined.append(right);
    tok.add_merge(left_id, right_id, int32_t(i), token_id(joined, i, merge));
  }

  // Harmony (gpt-oss): the reference implementation matches these markers in any text and always
  // renders them, so that a reply's channels can be read back from its text; the same here, or a
  // prompt tokenizes differently. <|end|> too where the vocabulary ends replies with <|return|>
  // and <|call|> (o200k_harmony), where it closes a message rather than the generation.
  auto has = [&](std::string_view text) { return tok.find_token(text).has_value(); };
  std::vector<std::string_view> always_matched = {"<|channel|>", "<|message|>", "<|start|>",
                                                  "<|constrain|>"};
  const bool harmony = has("<|return|>") && has("<|call|>") && has("<|end|>");
  if (harmony) always_matched.push_back("<|end|>");
  for (std::string_view text : always_matched)
    if (const std::optional<int32_t> id = tok.find_token(text))
      tok.token_types_[size_t(*id)] = TokenType::UserDefined;

  // Tokens that can be written in text: candidates for the special-token scan.
  for (size_t i = 0; i < n_vocab; ++i) {
    const TokenType type = tok.token_types_[i];
    const bool special =
        type == TokenType::Control || type == TokenType::UserDefined || type == TokenType::Unknown;
    const std::string_view text = tok.text_of(int32_t(i));
    if (!special || text.empty()) continue;
    tok.special_by_first_byte_[uint8_t(text[0])].push_back(int32_t(i));
  }
  for (auto& list : tok.special_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return tok.text_of(a).size() > tok.text_of(b).size();
    });

  tok.bos_id_ = read_token_id(file, "tokenizer.ggml.bos_token_id", n_vocab);
  tok.eos_id_ = read_token_id(file, "tokenizer.ggml.eos_token_id", n_vocab);
  tok.eot_id_ = read_token_id(file, "tokenizer.ggml.eot_token_id", n_vocab);
  // End of generation: EOS, end of turn and end of message where the file names them, and the
  // tokens every chat family ends a reply with, found by their text (as the reference
  // implementation does: files rarely list them all).
  for (const std::optional<int32_t> id :
       {tok.eos_id_, tok.eot_id_, read_token_id(file, "tokenizer.ggml.eom_token_id", n_vocab)})
    if (id) tok.eog_ids_.push_back(*id);
  for (std::string_view text :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
        "<|endoftext|>", "<|eom_id|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>"}) {
    const std::optional<int32_t> id = tok.find_token(text);
    if (!id || (harmony && text == "<|end|>")) continue;
    const TokenType type = tok.token_types_[size_t(*id)];
    if (type != TokenType::Control && type != TokenType::UserDefined) continue;
    if (std::find(tok.eog_ids_.begin(), tok.eog_ids_.end(), *id) == tok.eog_ids_.end())
      tok.eog_ids_.push_back(*id);
  }
  if (harmony)  // <|end|> closes a message; the reply goes on (a file may name it as EOS)
    std::erase(tok.eog_ids_, *tok.find_token("<|end|>"));
  tok.add_bos_by_default_ = file.get_bool_or("tokenizer.ggml.add_bos_token", false);
  if (tok.add_bos_by_default_ && !tok.bos_id_)
    fail("{}: 'tokenizer.ggml.add_bos_token' is true but 'tokenizer.ggml.bos_token_id' is missing",
         name);
  return tok;
}

void Tokenizer::build_text_index() {
  const size_t n_vocab = text_offsets_.size() - 1;
  text_index_.assign(std::bit_ceil(std::max<size_t>(16, 2 * n_vocab)), TextSlot{});
  const size_t mask = text_index_.size() - 1;
  for (size_t i = 0; i < n_vocab; ++i) {
    const std::string_view text = text_of(int32_t(i));
    const uint32_t hash = text_hash(text);
    size_t slot = hash & mask;
    bool duplicate = false;
    for (; text_index_[slot].id >= 0; slot = (slot + 1) & mask) {
      if (text_index_[slot].hash == hash && text_of(text_index_[slot].id) == text) {
        duplicate = true;  // a text listed twice keeps its first id
        break;
      }
    }
    if (!duplicate) text_index_[slot] = {hash, int32_t(i)};
  }
}

void Tokenizer::add_merge(int32_t left, int32_t right, int32_t rank, int32_t token) {
  const uint64_t pair = pair_key(left, right);
  const size_t mask = merge_table_.size() - 1;
  size_t slot = pair_slot(pair, mask);
  for (; merge_table_[slot].pair != kNoPair; slot = (slot + 1) & mask)
    if (merge_table_[slot].pair == pair) return;  // a repeated pair keeps its first rank
  merge_table_[slot] = {pair, rank, token};
  ++n_merges_;
}

const Tokenizer::MergeSlot* Tokenizer::find_merge(int32_t left, int32_t right) const {
  const uint64_t pair = pair_key(left, right);
  const size_t mask = merge_table_.size() - 1;
  for (size_t slot = pair_slot(pair, mask);; slot = (slot + 1) & mask) {
    const MergeSlot& entry = merge_table_[slot];
    if (entry.pair == pair) return &entry;
    if (entry.pair == kNoPair) return nullptr;
  }
}

// ---- encoding ----------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_bos) {
    if (!bos_id_) fail("cannot add BOS: this vocabulary has no 'tokenizer.ggml.bos_token_id'");
    out.push_back(*bos_id_);
  }
  EncodeScratch scratch;
  // Special tokens first: at each position the longest one written there wins, and the plain
  // text before it is encoded on its own.
  size_t plain_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t found = -1;
    for (const int32_t id : special_by_first_byte_[uint8_t(text[pos])]) {
      const TokenType type = token_types_[size_t(id)];
      if (type != TokenType::UserDefined && !options.parse_special) continue;
      if (text.substr(pos).starts_with(text_of(id))) {
        found = id;
        break;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    encode_text(text.substr(plain_begin, pos - plain_begin), scratch, out);
    out.push_back(found);
    pos += text_of(found).size();
    plain_begin = pos;
  }
  encode_text(text.substr(plain_begin), scratch, out);
  return out;
}

void Tokenizer::encode_text(std::string_view text, EncodeScratch& scratch,
                            std::vector<int32_t>& out) const {
  if (text.empty()) return;
  pre_tokenizer_.split(text, scratch.spans);
  for (const TextSpan span : scratch.spans)
    encode_piece(text.substr(span.offset, span.size), scratch, out);
}

// Byte-level BPE of one piece: start from one symbol per byte and repeatedly apply the
// lowest-ranked merge among neighbouring pairs (leftmost first on ties). A heap of candidate
// pairs with lazy invalidation makes this O(n log n) in the piece length, so a long run of
// letters or spaces costs no more than its size.
void Tokenizer::encode_piece(std::string_view piece, EncodeScratch& scratch,
                             std::vector<int32_t>& out) const {
  using Symbol = EncodeScratch::Symbol;
  using Candidate = EncodeScratch::Candidate;
  const auto byte_token = [&](char c) {
    const int32_t id = byte_token_[uint8_t(c)];
    if (id < 0)
      fail("byte 0x{:02x} has no token in this vocabulary, so text containing it cannot be encoded",
           uint8_t(c));
    return id;
  };
  if (piece.size() == 1) {
    out.push_back(byte_token(piece[0]));
    return;
  }
  if (piece.size() > size_t(std::numeric_limits<int32_t>::max()))
    fail("cannot encode a piece of {} bytes: more than 2 GiB without a break", piece.size());

  auto& symbols = scratch.symbols;
  symbols.clear();
  const int32_t n = int32_t(piece.size());
  for (int32_t i = 0; i < n; ++i)
    symbols.push_back({byte_token(piece[size_t(i)]), i - 1, i + 1 < n ? i + 1 : -1});

  auto& heap = scratch.heap;
  heap.clear();
  const auto greater = std::greater<Candidate>();
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[size_t(left)].next;
    if (right < 0) return;
    const int32_t left_token = symbols[size_t(left)].token;
    const int32_t right_token = symbols[size_t(right)].token;
    const MergeSlot* merge = find_merge(left_token, right_token);
    if (merge == nullptr) return;
    heap.push_back({merge->rank, left, left_token, right_token, merge->token});
    std::push_heap(heap.begin(), heap.end(), greater);
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    const Candidate best = heap.back();
    heap.pop_back();
    Symbol& left = symbols[size_t(best.left)];
    if (left.token != best.left_token || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    if (right.token != best.right_token) continue;
    left.token = best.merged_token;
    right.token = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = best.left;
    consider(left.prev);
    consider(best.left);
  }
  // Symbol 0 never merges away (merges keep the left symbol), so the chain starts there.
  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].token);
}

// ---- decoding ----------------------------------------------------------------------------------

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    fail("token id {} is outside the vocabulary of {} tokens", id, n_vocab());
}

std::string_view Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return text_of(id);
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return token_types_[size_t(id)];
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const uint32_t hash = text_hash(text);
  const size_t mask = text_index_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    const TextSlot& entry = text_index_[slot];
    if (entry.id < 0) return std::nullopt;
    if (entry.hash == hash && text_of(entry.id) == text) return entry.id;
  }
}

std::string_view Tokenizer::piece_bytes(int32_t id, bool render_special) const {
  check_id(id);
  switch (token_types_[size_t(id)]) {
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::Unused:
      if (!render_special) return {};
      break;
    default:
      break;
  }
  return std::string_view(bytes_).substr(byte_offsets_[size_t(id)],
                                         byte_offsets_[size_t(id) + 1] - byte_offsets_[size_t(id)]);
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  return std::string(piece_bytes(id, render_special));
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (const int32_t id : ids) out.append(piece_bytes(id, render_special));
  return out;
}

// ---- streaming ---------------------------------------------------------------------------------

std::string StreamingDecoder::push(int32_t id) {
  pending_.append(tokenizer_->piece_bytes(id, render_special_));
  std::string out;
  drain(out);
  return out;
}

void StreamingDecoder::drain(std::string& out) {
  size_t pos = 0;
  while (pos < pending_.size()) {
    const Utf8Char c = scan_utf8_char(std::string_view(pending_).substr(pos));
    if (c.kind == Utf8Char::Kind::Incomplete) break;  // wait for the next token's bytes
    if (c.kind == Utf8Char::Kind::Complete)
      out.append(pending_, pos, c.size);
    else
      out += utf8_encode(kReplacementCharacter);
    pos += c.size;
  }
  pending_.erase(0, pos);
}

std::string StreamingDecoder::finish() {
  std::string out;
  drain(out);
  if (!pending_.empty()) out += utf8_encode(kReplacementCharacter);  // cut mid character
  pending_.clear();
  return out;
}

}  // namespace tandem
