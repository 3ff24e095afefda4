#pragma once
// Errors a person can cause (bad file, bad flag, bad request) are thrown as tandem::Error with
// a sentence that names the thing and what to do. Our own invariants use TANDEM_CHECK, which
// stays on in release builds because it guards memory safety, never user input.
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line);

}  // namespace tandem

#define TANDEM_CHECK(expr) \
  ((expr) ? (void)0 : ::tandem::check_failed(#expr, __FILE__, __LINE__))
