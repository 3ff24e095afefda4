#include "cli/commands.h"

namespace tandem::cli {

void register_gen_model(CLI::App& app) { (void)app; }

}  // namespace tandem::cli
