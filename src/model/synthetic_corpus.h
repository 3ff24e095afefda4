#pragma once
// The text the synthetic tokenizer is trained on: a few paragraphs of English and code written
// for tandem, so that common words become single tokens and generated models tokenize prose
// the way a real model roughly would.
#include <string_view>

namespace tandem {

std::string_view synthetic_tokenizer_corpus();

}  // namespace tandem
