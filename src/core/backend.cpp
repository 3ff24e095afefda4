#include "core/backend.h"

#include "core/error.h"

namespace tandem {

bool Backend::copy_from_peer(Backend&, void*, const void*, size_t) { return false; }

// Backends without graphs: the executor asks can_capture() first, so reaching these is a bug.
void Backend::begin_capture() { fail("{}: this device cannot capture a step as a graph", name()); }
std::unique_ptr<Graph> Backend::end_capture() {
  fail("{}: this device cannot capture a step as a graph", name());
}
void Backend::replay(Graph&) { fail("{}: this device cannot replay a graph", name()); }

}  // namespace tandem
