#pragma once
// A cold start measured against the disk it waits on: the model is dropped from the page cache,
// loaded, and run to its first token; then exactly the bytes that start needed are read again
// from an empty cache, in file order, the way the engine reads (BackgroundReader). The ratio of
// the two times says how much loading adds to the unavoidable reading (issue: "within 1.2x of
// reading the touched bytes").
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace tandem {

struct ColdStart {
  int64_t prompt_tokens = 0;
  // One entry per repetition; the disk's speed varies from run to run on shared machines, so a
  // cold start and the reading it is compared with alternate.
  std::vector<double> first_token_seconds;  // constructing the Engine + evaluating the prompt, cold
  std::vector<double> load_seconds;         // of which the Engine's constructor
  std::vector<double> read_seconds;         // reading only the bytes it needed from an empty cache
  double warm_first_token_seconds = 0;  // the same start with the whole model cached (0: not
                                        // measured, the model does not fit in free memory)
  uint64_t touched_bytes = 0;      // what a start needed from the files, in 2 MiB pieces
  uint64_t file_bytes = 0;         // all parts of the model
};

// `repetitions` times: a cold start, then reading its bytes alone. Needs the model's pages to
// be droppable: throws tandem::Error naming the file when another process keeps them mapped (a
// running `tandem serve`, say). Then reads the whole model back into the page cache (when it
// fits in free memory) and measures the same start warm, which says how much of the cold start
// is computing rather than waiting on the disk; the model stays cached for whatever is measured
// next.
ColdStart measure_cold_start(const EngineOptions& options, std::span<const int32_t> prompt, int repetitions);

}  // namespace tandem
