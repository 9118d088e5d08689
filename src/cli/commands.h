// The CLI's subcommands. Each registers its flags on the app and runs when chosen;
// user errors propagate as lmscope::UserError and become exit code 2 in main.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>

namespace lmscope::cli {

class Command {
 public:
  virtual ~Command() = default;
  virtual int run() = 0;
  CLI::App* app = nullptr;
};

std::unique_ptr<Command> add_info_command(CLI::App& parent);
std::unique_ptr<Command> add_train_command(CLI::App& parent);
std::unique_ptr<Command> add_bench_command(CLI::App& parent);
std::unique_ptr<Command> add_attention_command(CLI::App& parent);
std::unique_ptr<Command> add_memory_command(CLI::App& parent);
std::unique_ptr<Command> add_plan_command(CLI::App& parent);
std::unique_ptr<Command> add_precision_command(CLI::App& parent);
std::unique_ptr<Command> add_report_command(CLI::App& parent);
std::unique_ptr<Command> add_launch_command(CLI::App& parent);
std::unique_ptr<Command> add_allreduce_command(CLI::App& parent);

}  // namespace lmscope::cli
