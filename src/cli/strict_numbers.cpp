#include "strict_numbers.h"

#include "lmscope/core/error.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>

namespace lmscope::cli {
namespace {

// CLI11 reads whole numbers with strtoll/strtoull: "-1" wraps to 2^64 - 1 in an unsigned flag, a value
// past the type's range saturates to its largest (--seed -1 and --seed 2^64 were the same run), and
// "010" is octal; it reads "nan", "inf" and 1e999 as numbers. So every INT and UINT option of every
// command takes decimal whole numbers in range (rewritten to plain digits for CLI11), and every FLOAT
// option finite numbers; anything else is one sentence naming the flag and the range.
template <typename T>
void read_whole_numbers(CLI::Option& option) {
  const std::string flag = option.get_name();
  option.transform(CLI::Validator(
      [flag](std::string& text) {
        T value{};
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc() || end != text.data() + text.size())
          lmscope::user_error("{} takes a whole number from {} to {}, got '{}'", flag, std::numeric_limits<T>::min(),
                              std::numeric_limits<T>::max(), text);
        text = std::to_string(value);
        return std::string();
      },
      ""));
}

}  // namespace

void read_numbers_strictly(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type == "INT") read_whole_numbers<std::int64_t>(*option);
    if (type == "UINT") read_whole_numbers<std::uint64_t>(*option);
    if (type == "FLOAT") {
      const std::string flag = option->get_name();
      option->check(CLI::Validator(
          [flag](std::string& text) {
            double value = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
            if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
              lmscope::user_error("{} takes a finite number, got '{}'", flag, text);
            return std::string();
          },
          ""));
    }
    // A BOOLEAN option that takes a value (not a bare flag): CLI11 takes any whole number as one
    // (--causal -1 and --causal 1e308 ran) and answers others in its own words.
    if (type == "BOOLEAN" && option->get_type_size() > 0) {
      const std::string flag = option->get_name();
      option->transform(CLI::Validator(
          [flag](std::string& text) {
            if (text != "true" && text != "false" && text != "1" && text != "0")
              lmscope::user_error("{} takes true or false, got '{}'", flag, text);
            return std::string();
          },
          ""));
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) read_numbers_strictly(*sub);
}

std::string empty_value_error(const std::string& flag) {
  return fmt::format("{} was given an empty value; give it one, or leave the flag out", flag);
}

}  // namespace lmscope::cli
