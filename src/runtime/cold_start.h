#pragma once
// A cold start measured against the disk it waits on: the model is dropped from the page cache,
// loaded, and run to its first token; then exactly the bytes that start needed are read again
// from an empty cache, in file order. The ratio of the two times says
// how much loading adds to the unavoidable reading (issue: "within 1.2x of reading the touched
// bytes").
#include <cstdint>
#include <span>

#include "runtime/engine.h"

namespace tandem {

struct ColdStart {
  int64_t prompt_tokens = 0;
  double first_token_seconds = 0;  // constructing the Engine + evaluating the prompt, cold
  double load_seconds = 0;         // of which the Engine's constructor
  double warm_first_token_seconds = 0;  // the same again with the whole model cached (0: not
                                        // measured, the model does not fit in free memory)
  uint64_t touched_bytes = 0;      // what that needed from the files, in 2 MiB pieces
  double read_seconds = 0;         // reading only those bytes from an empty cache
  uint64_t file_bytes = 0;         // all parts of the model
};

// Needs the model's pages to be droppable: throws tandem::Error naming the file when another
// process keeps them mapped (a running `tandem serve`, say). Then reads the whole model back
// into the page cache (when it fits in free memory) and measures the same start warm, which
// says how much of the cold start is computing rather than waiting on the disk; the model
// stays cached for whatever is measured next.
ColdStart measure_cold_start(const EngineOptions& options, std::span<const int32_t> prompt);

}  // namespace tandem
