#pragma once
// A small byte-level BPE trainer. It exists for synthetic models (`tandem gen-model`): they need
// a real, self-consistent tokenizer without shipping anyone's vocabulary. Not meant for large
// corpora: it recounts pairs after every merge.
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct BpeVocabulary {
  std::vector<std::string> merged_tokens;  // token text (byte alphabet) produced by merge i
  std::vector<std::string> merges;         // "left right", in priority order
};

// Learns up to `max_merges` merges from `corpus`, split into words the way GPT-2-style
// pre-tokenizers do (a word keeps its leading space). Stops early when no pair occurs twice.
// Deterministic: ties go to the pair whose text sorts first.
BpeVocabulary train_byte_level_bpe(std::string_view corpus, size_t max_merges);

}  // namespace tandem
