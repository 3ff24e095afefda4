#include "cli/commands.h"

namespace tandem::cli {

void register_commands(CLI::App& app) {
  register_inspect(app);
  register_gen_model(app);
}

}  // namespace tandem::cli
