#pragma once
// `tandem repack`: rewrites a model so that the CPU's decode kernels read it faster. Every
// Q8_0, Q5_0 and Q4_K matrix that the forward pass only multiplies by (attention projections,
// dense and expert FFNs, the output head) is stored with 16 rows interleaved (Q8_0_R16,
// Q5_0_R16, Q4_K_R16; core/blocks.h). Q6_K stays: an interleaved Q6_K kernel was slower than
// the one-row kernel (its top bits cost four shifts per 32 bytes). Same values, so a repacked model gives the same tokens within rounding; Q4_K
// matrices grow by 2.8% (their 6-bit scales are stored as bytes), Q8_0 ones not at all. Lookup tables (token_embd), vectors, and tensors read in other ways keep
// their format. Done once, offline, so that loading stays a plain mmap.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"

namespace tandem {

struct RepackOptions {
  std::string input_path;   // a GGUF (or the first part of a split one)
  std::string output_path;  // one GGUF file, or the name of the image in `memory`
  bool show_progress = true;
  // When not empty: the copy is written here (from its start) instead of to a file.
  std::span<uint8_t> memory;
};

struct RepackSummary {
  int n_tensors = 0;      // in the file
  int n_interleaved = 0;  // of them, rewritten interleaved
  uint64_t interleaved_bytes = 0;
  uint64_t file_bytes = 0;
  double seconds = 0;
};

// Whether tensor `name` of a deepseek2 file is a matrix that the forward pass only multiplies by.
bool is_repackable_matrix(std::string_view name);

// Throws tandem::Error naming the file and the problem (unreadable input, output that cannot be
// written, input that is already repacked); an interrupted run leaves no output file. The copy
// records its input's GgufFile::header_fingerprint (metadata tandem.repacked.source).
RepackSummary repack_model(const RepackOptions& options, ThreadPool& pool);

// `--repack`: the repacked copy a run loads instead of `model` (opened already), so that a GGUF
// as downloaded gets the interleaved kernels' decode speed with no offline step. Kept beside the
// model as NAME.tandem-r16.gguf (or, where that folder is not writable, in
// $XDG_CACHE_HOME/tandem or ~/.cache/tandem): reused while its recorded source matches the
// model's size and header (and this version's layout), else made (again) first, with progress,
// one run at a time (a lock file beside it; runs killed while writing leave partial files that
// the next one removes), through a temporary name so that no run loads half a file. A model that is
// repacked already is its own copy. Throws tandem::Error naming the fix when no folder has room or
// can be written.
struct RepackedCopy {
  std::string path;
  std::unique_ptr<AlignedBuffer> memory;  // the image of an in-memory copy (outlives `file`)
  std::unique_ptr<gguf::GgufFile> file;  // the copy, opened (null: the model is repacked already)
  bool made = false;                     // written by this call (on `n_threads` threads)
  RepackSummary summary;                 // when made
};
RepackedCopy repacked_copy(const gguf::GgufFile& model, int n_threads, bool show_progress);
// `--repack-in-memory`: the same copy made in RAM (on 2 MiB pages) at every load, no file
// written: the repack's time each run and the copy's size in memory (the model's own pages stay
// in the page cache, which the kernel may drop), for a model whose folder and cache cannot hold
// a second copy. `memory` holds the image `file` reads: keep it as long as the file.
RepackedCopy repacked_in_memory(const gguf::GgufFile& model, int n_threads, bool show_progress);
// What a file records of the model it was repacked from (empty for any other file).
std::string repacked_source(const gguf::GgufFile& file);

}  // namespace tandem
