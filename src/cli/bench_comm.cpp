// Placeholder while the command is being written (replaced in this session).
#include "cli/commands.h"
namespace mt::cli {
void register_bench_comm(CLI::App&) {}
}  // namespace mt::cli
