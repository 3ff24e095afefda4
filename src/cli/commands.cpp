#include "cli/commands.h"

namespace tandem::cli {

void register_commands(CLI::App& app) {
  register_inspect(app);
  register_run(app);
  register_chat(app);
  register_eval(app);
  register_tokenize(app);
  register_apply_template(app);
  register_profile(app);
  register_bench(app);
  register_plan(app);
  register_serve(app);
  register_gen_model(app);
  register_repack(app);
}

}  // namespace tandem::cli
