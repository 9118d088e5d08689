// lmscope's command line: one subcommand per question.
// Exit codes: 0 success, 2 user error (one sentence on stderr), 1 a failure of the machine or an internal
// one, 128 + the signal for a command stopped by SIGINT, SIGTERM or SIGHUP.
#include "commands.h"
#include "stop_signals.h"
#include "strict_numbers.h"

#include "lmscope/core/error.h"

#include <fmt/core.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

namespace {

// A message as a terminal should get it: bytes that are not UTF-8 (a value given as such, echoed back)
// and control characters (a newline in a value would split the sentence in two lines) as \xNN.
std::string shown(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
    const unsigned char c = byte(0);
    const std::size_t n = c < 0x80                 ? 1
                          : c >= 0xC2 && c <= 0xDF ? 2
                          : (c & 0xF0) == 0xE0     ? 3
                          : c >= 0xF0 && c <= 0xF4 ? 4
                                                   : 0;
    bool ok = n > 0 && i + n <= text.size() && !(n == 1 && (c < 0x20 || c == 0x7F));
    for (std::size_t k = 1; ok && k < n; ++k) ok = (byte(k) & 0xC0) == 0x80;
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8 either.
    if (ok && n >= 3)
      ok = !(c == 0xE0 && byte(1) < 0xA0) && !(c == 0xED && byte(1) >= 0xA0) && !(c == 0xF0 && byte(1) < 0x90) &&
           !(c == 0xF4 && byte(1) >= 0x90);
    if (!ok) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

// One line of the program's own on stderr: the prefix and the message, shown as above.
void say(const std::string& prefix, std::string_view message) {
  fmt::print(stderr, "{}{}\n", shown(prefix), shown(message));
}

// "lmscope: " and, in one rank of several, "rank R: ", so the lines of N ranks sharing a terminal say
// whose they are. Read leniently: a malformed variable is the command's to report, not this prefix's.
std::string error_prefix() {
  for (auto [rank_var, size_var] : {std::pair{"RANK", "WORLD_SIZE"}, std::pair{"SLURM_PROCID", "SLURM_NTASKS"}}) {
    const char* rank = std::getenv(rank_var);
    const char* size = std::getenv(size_var);
    if (rank == nullptr || size == nullptr) continue;
    if (std::atoi(size) > 1 && *rank != '\0') return fmt::format("lmscope: rank {}: ", rank);
    return "lmscope: ";
  }
  return "lmscope: ";
}

// SIGINT, SIGTERM or SIGHUP end a command with one line and exit 128 + the signal (as train's clean
// stop does), not by the signal: train, which saves a checkpoint first, takes them over once it runs;
// launch takes them with sigtimedwait and passes them on to its ranks.
using lmscope::cli::kStopSignals;
using lmscope::cli::signal_name;
constexpr std::size_t kStops = std::size(kStopSignals);
char stop_lines[kStops][160];
std::size_t stop_lengths[kStops];

extern "C" void stop_now(int sig) {
  for (std::size_t i = 0; i < kStops; ++i)
    if (kStopSignals[i] == sig && ::write(STDERR_FILENO, stop_lines[i], stop_lengths[i]) < 0) break;
  ::_exit(128 + sig);
}

void stop_on_signals(const std::string& prefix) {
  for (std::size_t i = 0; i < kStops; ++i) {
    const std::string line =
        fmt::format("{}stopped by {}\n", prefix, signal_name(kStopSignals[i])).substr(0, sizeof stop_lines[i] - 1);
    std::copy(line.begin(), line.end(), stop_lines[i]);
    stop_lengths[i] = line.size();
    std::signal(kStopSignals[i], stop_now);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lmscope: train, benchmark and profile Transformer language models", "lmscope"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lmscope 0.1.0");
  std::vector<std::unique_ptr<lmscope::cli::Command>> commands;
  commands.push_back(lmscope::cli::add_info_command(app));
  commands.push_back(lmscope::cli::add_train_command(app));
  commands.push_back(lmscope::cli::add_bench_command(app));
  commands.push_back(lmscope::cli::add_attention_command(app));
  commands.push_back(lmscope::cli::add_memory_command(app));
  commands.push_back(lmscope::cli::add_plan_command(app));
  commands.push_back(lmscope::cli::add_precision_command(app));
  commands.push_back(lmscope::cli::add_report_command(app));
  commands.push_back(lmscope::cli::add_launch_command(app));
  commands.push_back(lmscope::cli::add_allreduce_command(app));
  lmscope::cli::read_numbers_strictly(app);
  // Every command there is, for the messages below.
  std::string names;
  for (std::size_t i = 0; i < commands.size(); ++i)
    names += (i == 0 ? "" : i + 1 == commands.size() ? " or " : ", ") + commands[i]->app->get_name();
  const std::string prefix = error_prefix();
  stop_on_signals(prefix);
  if (argc < 2) {
    say(prefix, fmt::format("error: a command is required: {} (see lmscope --help)", names));
    return 2;
  }
  const std::string first = argv[1];
  bool known = first[0] == '-';
  for (const auto& c : commands) known |= c->app->get_name() == first;
  if (!known) {
    say(prefix, fmt::format("error: unknown command '{}' (use {})", first, names));
    return 2;
  }
  // An empty value is no value: `--lr ''` would train with lr 0, `--save ''` save nothing.
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool empty_after_equals = arg.starts_with("--") && arg.ends_with("=");
    if (!arg.empty() && !empty_after_equals) continue;
    const std::string flag = empty_after_equals ? arg.substr(0, arg.size() - 1) : std::string(argv[i - 1]);
    if (flag.starts_with("-"))
      say(prefix, "error: " + lmscope::cli::empty_value_error(flag));
    else
      say(prefix, fmt::format("error: argument {} is empty", i));
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    say(prefix, fmt::format("error: {} (see lmscope --help)", e.what()));
    return 2;
  } catch (const lmscope::UserError& e) {  // a number refused as it was read (read_numbers_strictly)
    say(prefix, fmt::format("error: {}", e.what()));
    return 2;
  }
  try {
    for (auto& c : commands)
      if (c->app->parsed()) return c->run();
  } catch (const lmscope::OutOfMemory& e) {
    say(prefix, fmt::format("error: {}", e.what()));
    return 2;
  } catch (const lmscope::UserError& e) {
    say(prefix, fmt::format("error: {}", e.what()));
    return 2;
  } catch (const std::bad_alloc&) {  // a host buffer of the size asked for (the device's are OutOfMemory)
    say(prefix, "error: the host's memory cannot hold what this run asked for; ask for less");
    return 2;
  } catch (const lmscope::RankFailure& e) {
    say(prefix, fmt::format("error: {}", e.what()));
    return 1;
  } catch (const lmscope::EnvironmentFailure& e) {
    say(prefix, fmt::format("error: {}", e.what()));
    return 1;
  } catch (const std::exception& e) {
    say(prefix, fmt::format("internal error: {}", e.what()));
    return 1;
  }
  return 1;
}
