// The signals that stop a command cleanly: SIGINT (a terminal's Ctrl-C), SIGTERM (kill, a scheduler's
// notice) and SIGHUP (a closed terminal). main() ends any command on them with one line, train takes
// them over to checkpoint first, and launch passes them on to its ranks: all from this one list.
#pragma once

#include <signal.h>

#include <string>

namespace lmscope::cli {

inline constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

inline bool is_stop_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

// A process that stopped on one of them as lmscope does: its exit code, 128 + the signal.
inline bool is_stop_code(int code) { return is_stop_signal(code - 128); }

// "SIGINT", "SIGKILL", ... ("signal N" for one without a name here).
std::string signal_name(int sig);

}  // namespace lmscope::cli
