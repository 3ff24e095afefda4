#include "cli/commands.h"

namespace tandem::cli {

void register_inspect(CLI::App& app) { (void)app; }

}  // namespace tandem::cli
