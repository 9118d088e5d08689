// lmscope report: one self-contained HTML page from result files of bench, memory and attention
// (--format json), memory timelines (memory --svg) and training logs (train --log): the seeds'
// tables and plots in one place.
#include "commands.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/core/error.h"
#include "lmscope/io/regular_file.h"
#include "lmscope/report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace lmscope::cli {
namespace {

// The first event attribute (onload=, onclick= ...) inside a tag of lowercase SVG text, or "".
std::string event_attribute(const std::string& svg) {
  for (std::size_t open = svg.find('<'); open != std::string::npos; open = svg.find('<', open + 1)) {
    const std::size_t close = std::min(svg.find('>', open), svg.size());
    for (std::size_t i = open + 1; i + 2 < close; ++i) {
      const bool starts =
          (std::isspace(static_cast<unsigned char>(svg[i])) || svg[i] == '/') && svg[i + 1] == 'o' && svg[i + 2] == 'n';
      if (!starts) continue;
      std::size_t j = i + 3;
      while (j < close && std::isalpha(static_cast<unsigned char>(svg[j]))) ++j;
      const std::size_t name_end = j;
      while (j < close && std::isspace(static_cast<unsigned char>(svg[j]))) ++j;
      if (name_end > i + 3 && j < close && svg[j] == '=') return svg.substr(i + 1, name_end - i - 1);
    }
    if (close == svg.size()) break;
    open = close;
  }
  return "";
}

// An SVG file to inline in the page: its <svg> element, without an XML prolog or doctype.
std::string svg_element(const std::string& path) {
  const std::string s = read_regular_file(path, "the timeline");
  const auto begin = s.find("<svg"), end = s.rfind("</svg>");
  // Only lmscope's own timelines go in: the page promises no scripts and nothing fetched.
  const bool timeline = begin != std::string::npos && end != std::string::npos && end > begin &&
                        s.find("Active memory: ") != std::string::npos;
  if (!timeline) user_error("'{}' is not a memory timeline (what lmscope memory --svg writes)", path);
  // Looked for in any case (HTML reads <SCRIPT> as <script>), with event attributes and CSS that fetches.
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* active : {"<script", "javascript:", "<foreignobject", "href", "<iframe", "<object", "<embed",
                             "<style", "url(", "@import"})
    if (lower.find(active) != std::string::npos)
      user_error("'{}' holds {}, which a memory timeline never does", path, active);
  if (const std::string handler = event_attribute(lower); !handler.empty())
    user_error("'{}' holds an {} attribute, which a memory timeline never does", path, handler);
  return s.substr(begin, end + 6 - begin);
}

class ReportCommand : public Command {
 public:
  explicit ReportCommand(CLI::App& parent) {
    app = parent.add_subcommand("report",
                                "One self-contained HTML page from result files: tables, step time against context "
                                "and model size, time by phase and kernel category, memory, attention");
    app->add_option("--bench", bench_, "lmscope bench --format json results (comma list)");
    app->add_option("--memory", memory_, "lmscope memory --format json results (comma list)");
    app->add_option("--attention", attention_, "lmscope attention --format json results (comma list)");
    app->add_option("--timeline", timelines_, "lmscope memory --svg pictures to include (comma list)");
    app->add_option("--train", train_, "lmscope train --log files, one run each (comma list)");
    app->add_option("--title", title_, "The page's title")->capture_default_str();
    app->add_option("--out", out_, "The HTML file to write")->capture_default_str();
  }

  int run() override {
    if (bench_.empty() && memory_.empty() && attention_.empty() && timelines_.empty() && train_.empty())
      user_error("nothing to report: give --bench, --memory, --attention, --timeline or --train files");
    report::ReportInputs in;
    in.title = title_;
    const auto files = [](const std::string& list) {
      return list.empty() ? std::vector<std::string>{} : split_list(list);
    };
    for (const std::string& f : files(bench_)) in.bench.push_back({f, report::read_bench_file(f)});
    for (const std::string& f : files(memory_)) in.memory.push_back({f, report::read_memory_file(f)});
    for (const std::string& f : files(attention_)) in.attention.push_back({f, report::read_attention_file(f)});
    for (const std::string& f : files(timelines_)) in.timelines.emplace_back(f, svg_element(f));
    for (const std::string& f : files(train_)) in.train.push_back({f, report::read_train_log(f)});
    const std::string html = report::html_report(in);
    write_file(out_, html);
    fmt::print("wrote {} ({:.1f} KiB)\n", out_, static_cast<double>(html.size()) / 1024);
    return 0;
  }

 private:
  std::string bench_, memory_, attention_, timelines_, train_, title_ = "lmscope report", out_ = "report.html";
};

}  // namespace

std::unique_ptr<Command> add_report_command(CLI::App& parent) { return std::make_unique<ReportCommand>(parent); }

}  // namespace lmscope::cli
