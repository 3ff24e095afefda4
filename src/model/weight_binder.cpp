#include "model/weight_binder.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace tandem {
namespace {

std::string shape_text(std::initializer_list<int64_t> shape) {
  std::string text;
  for (int64_t d : shape) text += (text.empty() ? "" : " x ") + std::to_string(d);
  return "[" + text + "]";
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text;
  for (uint64_t d : shape) text += (text.empty() ? "" : " x ") + std::to_string(d);
  return "[" + text + "]";
}

}  // namespace

WeightBinder::WeightBinder(const gguf::GgufFile& file, Backend& backend)
    : file_(file), backend_(backend) {}

bool WeightBinder::has(std::string_view name) const { return file_.find_tensor(name) != nullptr; }

const gguf::TensorInfo& WeightBinder::info(std::string_view name,
                                           std::initializer_list<int64_t> shape) {
  const gguf::TensorInfo& t = checked(name, shape);
  note_bound(t, /*in_place=*/false);
  return t;
}

void WeightBinder::note_bound(const gguf::TensorInfo& tensor, bool in_place) {
  for (Bound& b : bound_)
    if (b.tensor == &tensor) {  // bound twice (tied embeddings): in place if either use is
      b.in_place |= in_place;
      return;
    }
  bound_.push_back({&tensor, in_place});
}

const gguf::TensorInfo& WeightBinder::checked(std::string_view name,
                                              std::initializer_list<int64_t> shape) const {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (!t) fail("{}: tensor '{}' is missing; the file does not match its architecture", file_.name(), name);
  // Trailing dimensions of 1 may be left out on either side.
  std::vector<uint64_t> want(shape.begin(), shape.end()), have = t->shape;
  while (want.size() > 1 && want.back() == 1) want.pop_back();
  while (have.size() > 1 && have.back() == 1) have.pop_back();
  if (want != have)
    fail("{}: tensor '{}' has shape {}, expected {} from the hyperparameters", file_.name(), name,
         shape_text(t->shape), shape_text(shape));
  if (!can_dequantize(t->type) && !is_interleaved(t->type))
    fail("{}: tensor '{}' is stored as {}, which tandem cannot read yet; supported: F32, F16, BF16, "
         "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, "
         "TQ2_0, MXFP4, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (and the "
         "interleaved *_R16 formats for matrices)",
         file_.name(), name, dtype_name(t->type));
  return *t;
}

const void* WeightBinder::device_pointer(const void* host, size_t bytes, const std::string& what,
                                         Backend& on, std::vector<uint8_t>* made) {
  bound_bytes_ += bytes;
  if (on.uses_host_memory()) return host;
  auto buffer = on.allocate(bytes, what);
  owned_.push_back(buffer);
  if (made && !made->empty()) {
    // Bytes built at load (packed experts, taken-apart rows) go now and are let go: queued, they
    // would all sit in RAM at once beside the page cache (a GPU's share of a big model).
    on.copy_from_host(buffer->data(), host, bytes);
    made->clear();
    made->shrink_to_fit();
    return buffer->data();
  }
  uploads_.push_back({&on, buffer->data(), host, bytes});
  return buffer->data();
}

void WeightBinder::finish_uploads(bool show_progress) {
  if (upload_error_) std::rethrow_exception(upload_error_);  // the weights are not all there
  if (uploads_.empty()) return;
  std::vector<Backend*> devices;
  uint64_t total = 0;
  for (const Upload& u : uploads_) {
    total += u.bytes;
    if (std::find(devices.begin(), devices.end(), u.on) == devices.end()) devices.push_back(u.on);
  }
  std::string label = "uploading weights to ";
  for (size_t i = 0; i < devices.size(); ++i) label += (i ? ", " : "") + devices[i]->name();
  // Small models load in a blink: no line for them.
  Progress progress(label, total, show_progress && total >= (uint64_t(256) << 20));
  std::mutex progress_mutex;
  uint64_t done = 0;
  std::vector<std::exception_ptr> errors(devices.size());
  std::atomic<bool> failed{false};  // one device failing stops the others early
  std::vector<std::thread> threads;
  for (size_t d = 0; d < devices.size(); ++d)
    threads.emplace_back([&, d] {
      // Pieces of at most 64 MiB, so the progress line moves on large tensors too.
      constexpr size_t kPiece = size_t(64) << 20;
      try {
        for (const Upload& u : uploads_) {
          if (u.on != devices[d]) continue;
          for (size_t offset = 0; offset < u.bytes && !failed.load(); offset += kPiece) {
            const size_t n = std::min(kPiece, u.bytes - offset);
            u.on->copy_from_host(static_cast<uint8_t*>(u.dst) + offset, static_cast<const uint8_t*>(u.src) + offset, n);
            std::lock_guard lock(progress_mutex);
            progress.update(done += n);
          }
        }
      } catch (...) {
        errors[d] = std::current_exception();
        failed = true;
      }
    });
  for (std::thread& t : threads) t.join();
  progress.finish();
  uploads_.clear();
  for (const std::exception_ptr& e : errors)
    if (e) {
      upload_error_ = e;  // every later call says so: computing with half the weights is no option
      std::rethrow_exception(e);
    }
}

WeightView WeightBinder::for_device(WeightView view, const std::string& what, Backend& on,
                                    std::vector<uint8_t>& made) {
  if (on.can_multiply(view.type)) return view;
  const DType base = dtype_info(view.type).base;
  if (!is_interleaved(view.type) || !on.can_multiply(base))
    fail("{}: {} cannot multiply '{}', stored as {}; keep it on the CPU (--rules) or use a file "
         "with another format",
         file_.name(), on.name(), what, dtype_name(view.type));
  if (!told_taken_apart_) {
    told_taken_apart_ = true;
    std::fprintf(stderr, "tandem: note: %s was rewritten by `tandem repack` for the CPU; %s reads "
                 "the original GGUF layout, so its weights are taken apart back into it while "
                 "loading (exact, no requantization; loading the original file skips this step)\n",
                 file_.name().c_str(), on.name().c_str());
  }
  const int64_t n_rows = view.rows * view.n_mats;
  const uint64_t group_bytes = view.row_bytes * 16, plain_row = row_bytes(base, uint64_t(view.cols));
  std::vector<uint8_t> plain(plain_row * uint64_t(n_rows));
  for (int64_t g = 0; g < n_rows / 16; ++g)
    take_apart_rows(view.type, static_cast<const uint8_t*>(view.data) + uint64_t(g) * group_bytes, view.cols,
                    plain.data() + uint64_t(g) * 16 * plain_row);
  made = std::move(plain);
  view.type = base;
  view.row_bytes = plain_row;
  view.data = made.data();
  return view;
}

WeightView WeightBinder::place(WeightView view, const std::string& what, Backend& on) {
  std::vector<uint8_t> made;
  view = for_device(view, what, on, made);
  if (on.uses_host_memory() && !made.empty()) view.data = converted_bytes_.emplace_back(std::move(made)).data();
  view.data = device_pointer(view.data, view.matrix_bytes() * uint64_t(view.n_mats), what, on, &made);
  return view;
}

WeightView WeightBinder::matrix(std::string_view name, std::initializer_list<int64_t> shape) {
  return matrix(name, shape, backend_);
}

WeightView WeightBinder::matrix(std::string_view name, std::initializer_list<int64_t> shape, Backend& on) {
  const gguf::TensorInfo& t = checked(name, shape);
  note_bound(t, on.uses_host_memory());
  WeightView view;
  view.type = t.type;
  view.cols = int64_t(t.shape[0]);
  view.rows = t.shape.size() > 1 ? int64_t(t.shape[1]) : 1;
  view.n_mats = t.shape.size() > 2 ? int64_t(t.shape[2]) : 1;
  view.row_bytes = row_bytes(t.type, t.shape[0]);
  view.data = t.data;
  return place(view, std::string(name), on);
}

WeightView WeightBinder::rows(std::string_view name, std::initializer_list<int64_t> shape,
                              int64_t first, int64_t n, Backend& on) {
  const gguf::TensorInfo& t = checked(name, shape);
  TANDEM_CHECK(t.shape.size() <= 2 && first >= 0 && n > 0 && first + n <= int64_t(t.shape[1]));
  const uint32_t group = dtype_info(t.type).row_group;
  if (first % group != 0 || n % group != 0)
    fail("{}: rows {}-{} of '{}' cut its groups of {} interleaved rows (`tandem repack`); split "
         "the heads elsewhere or use the original file",
         file_.name(), first, first + n - 1, name, group);
  note_bound(t, on.uses_host_memory());
  WeightView view{.type = t.type, .cols = int64_t(t.shape[0]), .rows = n, .n_mats = 1,
                  .row_bytes = row_bytes(t.type, t.shape[0])};
  view.data = static_cast<const uint8_t*>(t.data) + uint64_t(first) * view.row_bytes;
  return place(view, std::string(name), on);
}

WeightView WeightBinder::columns(std::string_view name, std::initializer_list<int64_t> shape,
                                 int64_t first, int64_t n, Backend& on) {
  const gguf::TensorInfo& t = checked(name, shape);
  const int64_t cols = int64_t(t.shape[0]), n_rows = t.shape.size() > 1 ? int64_t(t.shape[1]) : 1;
  TANDEM_CHECK(t.shape.size() <= 2 && first >= 0 && n > 0 && first + n <= cols);
  note_bound(t, /*in_place=*/false);
  // Interleaved rows are taken apart first: their columns are not contiguous per row.
  const DType type = dtype_info(t.type).base;
  const uint32_t block = dtype_info(type).block_elems;
  if (first % block != 0 || n % block != 0)
    fail("{}: columns {}-{} of '{}' ({}) cut its blocks of {} values: these heads cannot be "
         "split there; give each device a multiple of {} columns' worth of heads",
         file_.name(), first, first + n - 1, name, dtype_name(t.type), block, block);
  const uint64_t src_row = row_bytes(type, uint64_t(cols)), dst_row = row_bytes(type, uint64_t(n));
  const uint64_t offset = row_bytes(type, uint64_t(first));
  std::vector<uint8_t> plain;
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  if (is_interleaved(t.type)) {
    plain.resize(src_row * uint64_t(n_rows));
    const uint64_t group_bytes = row_bytes(t.type, uint64_t(cols)) * 16;
    for (int64_t g = 0; g < n_rows / 16; ++g)
      take_apart_rows(t.type, src + uint64_t(g) * group_bytes, cols, plain.data() + uint64_t(g) * 16 * src_row);
    src = plain.data();
  }
  std::vector<uint8_t> made(dst_row * uint64_t(n_rows));
  for (int64_t r = 0; r < n_rows; ++r)
    std::memcpy(made.data() + uint64_t(r) * dst_row, src + uint64_t(r) * src_row + offset, dst_row);
  WeightView view{.type = type, .cols = n, .rows = n_rows, .n_mats = 1, .row_bytes = dst_row};
  const std::string what = fmt::format("{} (columns {}-{})", name, first, first + n - 1);
  std::vector<uint8_t> unused;  // a plain format: nothing to take apart
  view = for_device(view, what, on, unused);
  if (on.uses_host_memory()) {
    std::vector<uint8_t>& kept = converted_bytes_.emplace_back(std::move(made));
    view.data = device_pointer(kept.data(), kept.size(), what, on);
    return view;
  }
  view.data = device_pointer(made.data(), made.size(), what, on, &made);
  return view;
}

WeightView WeightBinder::matrices(std::string_view name, std::initializer_list<int64_t> shape,
                                  std::span<const int32_t> indices, Backend& on) {
  const gguf::TensorInfo& t = checked(name, shape);
  WeightView all;
  all.type = t.type;
  all.cols = int64_t(t.shape[0]);
  all.rows = t.shape.size() > 1 ? int64_t(t.shape[1]) : 1;
  all.n_mats = t.shape.size() > 2 ? int64_t(t.shape[2]) : 1;
  all.row_bytes = row_bytes(t.type, t.shape[0]);
  all.data = t.data;
  WeightView view = all;
  view.n_mats = int64_t(indices.size());
  const uint64_t bytes = all.matrix_bytes();
  // On the host the chosen matrices are packed into one buffer only when they are not already
  // the whole stack in order (the common single-device case stays zero-copy).
  bool whole = int64_t(indices.size()) == all.n_mats;
  for (size_t i = 0; whole && i < indices.size(); ++i) whole = indices[i] == int32_t(i);
  note_bound(t, whole && on.uses_host_memory());
  std::vector<uint8_t> made;
  if (!whole) {
    made.resize(bytes * indices.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      TANDEM_CHECK(indices[i] >= 0 && indices[i] < all.n_mats);
      std::memcpy(made.data() + i * bytes, all.matrix(indices[i]).data, bytes);
    }
    view.data = made.data();
  }
  std::vector<uint8_t> plain;
  view = for_device(view, std::string(name), on, plain);
  if (!plain.empty()) made = std::move(plain);
  const size_t view_bytes = view.matrix_bytes() * uint64_t(view.n_mats);
  if (on.uses_host_memory() && !made.empty()) {
    // The host uses the packed copy itself: kept as long as the binder.
    std::vector<uint8_t>& kept = converted_bytes_.emplace_back(std::move(made));
    view.data = device_pointer(kept.data(), view_bytes, std::string(name), on);
    return view;
  }
  view.data = device_pointer(view.data, view_bytes, std::string(name), on, &made);
  return view;
}

const float* WeightBinder::f32(std::string_view name, std::initializer_list<int64_t> shape) {
  return f32(name, shape, backend_);
}

const float* WeightBinder::f32(std::string_view name, std::initializer_list<int64_t> shape, Backend& on) {
  const gguf::TensorInfo& t = checked(name, shape);
  if (is_interleaved(t.type))
    fail("{}: tensor '{}' is stored as {} (16 rows interleaved), but tandem reads it as a vector; "
         "`tandem repack` leaves such tensors as they are: repack the original file again",
         file_.name(), name, dtype_name(t.type));
  note_bound(t, t.type == DType::F32 && on.uses_host_memory());
  if (t.type == DType::F32)
    return static_cast<const float*>(device_pointer(t.data, t.n_bytes, std::string(name), on));
  std::vector<float>& values = converted_.emplace_back(t.n_elements);
  dequantize_row(t.type, t.data, values.data(), int64_t(t.n_elements));
  return static_cast<const float*>(
      device_pointer(values.data(), values.size() * sizeof(float), std::string(name), on));
}

const float* WeightBinder::f32_rows(std::string_view name, std::initializer_list<int64_t> shape,
                                    std::span<const int32_t> indices, Backend& on) {
  const gguf::TensorInfo& t = checked(name, shape);
  if (is_interleaved(t.type))
    fail(
        "{}: tensor '{}' is stored as {} (16 rows interleaved), but tandem reads its rows as "
        "vectors; repack the original file again",
        file_.name(), name, dtype_name(t.type));
  note_bound(t, /*in_place=*/false);
  const int64_t cols = int64_t(t.shape[0]), n_rows = int64_t(t.n_elements) / cols;
  std::vector<float> all(t.n_elements);
  dequantize_row(t.type, t.data, all.data(), int64_t(t.n_elements));
  std::vector<float>& values = converted_.emplace_back(indices.size() * size_t(cols));
  for (size_t i = 0; i < indices.size(); ++i) {
    TANDEM_CHECK(indices[i] >= 0 && indices[i] < n_rows);
    std::copy_n(all.begin() + indices[i] * cols, cols, values.begin() + int64_t(i) * cols);
  }
  return static_cast<const float*>(
      device_pointer(values.data(), values.size() * sizeof(float), std::string(name), on));
}

WeightView WeightBinder::owned(const std::vector<float>& values, DType type, int64_t cols,
                              int64_t rows, int64_t n_mats, const std::string& what, Backend& on) {
  TANDEM_CHECK(int64_t(values.size()) == cols * rows * n_mats);
  WeightView view;
  view.type = type;
  view.cols = cols;
  view.rows = rows;
  view.n_mats = n_mats;
  view.row_bytes = row_bytes(type, uint64_t(cols));
  std::vector<uint8_t>& bytes = converted_bytes_.emplace_back(view.row_bytes * uint64_t(rows * n_mats));
  for (int64_t r = 0; r < rows * n_mats; ++r)
    quantize_row(type, values.data() + r * cols, bytes.data() + uint64_t(r) * view.row_bytes, cols);
  view.data = device_pointer(bytes.data(), bytes.size(), what, on);
  return view;
}

}  // namespace tandem
