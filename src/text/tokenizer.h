#pragma once
// The byte-level BPE tokenizer of DeepSeek, Qwen3, gpt-oss, GLM and Kimi models, read from GGUF
// metadata (`tokenizer.ggml.*`): text -> token ids for prompts, ids -> bytes for output.
//
// Encoding has three stages, as in the implementations the fixtures come from:
//   1. special tokens written in the text (`<｜User｜>`) are cut out first, leftmost and then
//      longest match; everything between them is ordinary text;
//   2. the pre-tokenizer (regex list named by `tokenizer.ggml.pre`) cuts that text into pieces;
//   3. each piece, as bytes, is merged pairwise by merge rank (`tokenizer.ggml.merges`, rank =
//      position in the list) until no ranked pair is left.
// A Tokenizer is immutable after loading, so one instance can encode from many threads.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/pre_tokenizer.h"

namespace tandem {

namespace gguf {
class GgufFile;
}

// Token types, numbered as `tokenizer.ggml.token_type` stores them.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,      // BOS, EOS, chat-role markers: never produced from plain text
  UserDefined = 4,  // added tokens that are always recognised in text
  Unused = 5,       // padding ids ([PAD0] ...)
  Byte = 6,
};

struct EncodeOptions {
  bool add_bos = false;  // put the BOS id first (callers usually pass add_bos_by_default())
  // Recognise control tokens written in the text, as a rendered chat template needs. Off, their
  // text is tokenized like any other (so user input cannot forge a role marker). User-defined
  // tokens are recognised either way, as the reference implementations do.
  bool parse_special = false;
};

class Tokenizer {
 public:
  // Reads and validates the vocabulary; every problem names the metadata key at fault.
  static Tokenizer from_gguf(const gguf::GgufFile& file);

  std::vector<int32_t> encode(std::string_view text, EncodeOptions options = {}) const;

  // The bytes token `id` stands for. Control, unknown and unused tokens give their text only
  // when `render_special` is set (a chat shows no `<｜end▁of▁sentence｜>`, a debug dump does).
  // A piece may be part of a UTF-8 character; StreamingDecoder assembles whole characters.
  std::string token_to_piece(int32_t id, bool render_special = false) const;
  // The same without copying; the view lives as long as the Tokenizer.
  std::string_view piece_bytes(int32_t id, bool render_special = false) const;
  // The pieces of `ids` concatenated, exactly (not checked for UTF-8: the ids may end mid
  // character). Throws an Error for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t n_vocab() const { return int32_t(token_types_.size()); }
  size_t n_merges() const { return n_merges_; }
  // The token as the vocabulary writes it (byte alphabet: "Ġthe" for " the").
  std::string_view token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // The id whose vocabulary text is exactly `text`, if any.
  std::optional<int32_t> find_token(std::string_view text) const;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> eot_id() const { return eot_id_; }  // end of turn, where the file has one
  // Generation stops at these: EOS, end of turn and of message, and each chat family's reply
  // ends (<|im_end|>, <|return|> and <|call|> of Harmony, <|endoftext|>, ...) found in the
  // vocabulary.
  bool is_end_of_generation(int32_t id) const {
    return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
  }
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }
  // `tokenizer.ggml.add_bos_token` (false when absent).
  bool add_bos_by_default() const { return add_bos_by_default_; }
  const PreTokenizer& pre_tokenizer() const { return pre_tokenizer_; }

 private:
  // Open-addressing hash tables: the vocabulary has ~130k tokens and ~128k merges, and
  // node-based maps made loading and merging mostly cache misses.
  struct TextSlot {
    uint32_t hash = 0;
    int32_t id = -1;  // -1: empty
  };
  struct MergeSlot {
    uint64_t pair = kNoPair;  // left id << 32 | right id
    int32_t rank = 0;         // position in tokenizer.ggml.merges: lower merges first
    int32_t token = -1;       // the merged token
  };
  static constexpr uint64_t kNoPair = ~uint64_t(0);
  struct EncodeScratch;

  explicit Tokenizer(PreTokenizer pre_tokenizer) : pre_tokenizer_(std::move(pre_tokenizer)) {}
  void check_id(int32_t id) const;
  std::string_view text_of(int32_t id) const {
    return std::string_view(texts_).substr(
        text_offsets_[size_t(id)], text_offsets_[size_t(id) + 1] - text_offsets_[size_t(id)]);
  }
  void build_text_index();
  // The first merge of `left` followed by `right`, or nullptr.
  const MergeSlot* find_merge(int32_t left, int32_t right) const;
  // Adds a merge unless the pair is already there (the first, lowest rank wins).
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t token);
  // Appends the ids of ordinary text (no special tokens in it).
  void encode_text(std::string_view text, EncodeScratch& scratch, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, EncodeScratch& scratch,
                    std::vector<int32_t>& out) const;

  PreTokenizer pre_tokenizer_;
  std::vector<TokenType> token_types_;  // [n_vocab]
  // Token texts as in the file, back to back: token i is texts_[text_offsets_[i], [i + 1]).
  std::string texts_;
  std::vector<size_t> text_offsets_;  // [n_vocab + 1]
  // What each token decodes to, stored the same way.
  std::string bytes_;
  std::vector<size_t> byte_offsets_;    // [n_vocab + 1]
  std::vector<TextSlot> text_index_;    // power-of-two size, at most half full
  std::vector<MergeSlot> merge_table_;  // power-of-two size, at most half full
  size_t n_merges_ = 0;
  std::array<int32_t, 256> byte_token_{};  // the single-byte token of each byte; -1 if none
  // Control, unknown and user-defined tokens by their first byte, longest text first: the
  // candidates to try where that byte occurs in the text.
  std::array<std::vector<int32_t>, 256> special_by_first_byte_;
  std::optional<int32_t> bos_id_, eos_id_, eot_id_;
  std::vector<int32_t> eog_ids_;  // is_end_of_generation
  bool add_bos_by_default_ = false;
};

// Turns ids produced one at a time into text that is always whole UTF-8: bytes of a character
// split across tokens are held back until it is complete, and bytes that can never form a
// character come out as U+FFFD at once (so nothing is held longer than three bytes). It keeps a
// pointer to the Tokenizer, which must outlive it; use one decoder per output stream.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(&tokenizer), render_special_(render_special) {}

  // The new complete text that `id` makes available (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back, as U+FFFD (the sequence ended mid character); then resets.
  std::string finish();

 private:
  // Moves the complete characters at the front of pending_ to `out`.
  void drain(std::string& out);

  const Tokenizer* tokenizer_;
  bool render_special_;
  std::string pending_;  // bytes not yet returned: at most the start of one character
};

}  // namespace tandem
