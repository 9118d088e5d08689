// How every command reads numbers: strictly (read_numbers_strictly), so that a value CLI11 would
// wrap, saturate, read as octal or as a non-finite number is refused in one sentence. main() applies
// it to every command, the Python package to the flags its RunSpec reads.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace lmscope::cli {

void read_numbers_strictly(CLI::App& app);
// The sentence for a flag given an empty value (an empty value is no value: `--lr ''` would train with
// lr 0, `--save ''` save nothing).
std::string empty_value_error(const std::string& flag);

}  // namespace lmscope::cli
