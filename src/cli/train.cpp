// Placeholder while the command is being written (replaced in this session).
#include "cli/commands.h"
namespace mt::cli {
void register_train(CLI::App&) {}
}  // namespace mt::cli
