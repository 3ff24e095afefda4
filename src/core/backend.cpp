#include "core/backend.h"

#include "core/error.h"

namespace tandem {

// Backends without graphs: the executor asks can_capture() first, so reaching these is a bug.
void Backend::begin_capture() { fail("{}: this device cannot capture a step as a graph", name()); }
std::unique_ptr<Graph> Backend::end_capture() {
  fail("{}: this device cannot capture a step as a graph", name());
}
void Backend::replay(Graph&) { fail("{}: this device cannot replay a graph", name()); }

}  // namespace tandem
