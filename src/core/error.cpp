#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace tandem {

void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "tandem: internal error: %s failed at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace tandem
