// `gpumem view`: the terminal viewer of snapshots and traces (gpumem::view). Without ncurses the
// viewer library is not built and this command says so.
#include <memory>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "command_line.h"
#include "commands.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/moment.h"

#if GPUMEM_HAVE_VIEWER
#include "gpumem/view/render.h"
#include "gpumem/view/terminal.h"
#include "gpumem/view/text_report.h"
#include "gpumem/view/view_state.h"
#include "gpumem/view/viewer_model.h"
#endif

namespace gpumem::cli {
namespace {

std::string help_text() {
  return
      "usage: gpumem view FILE [--at MOMENT] [--diff FILE2] [--report] [--width N] [--colors MODE]\n"
      "                        [--device N]\n"
      "\n"
      "An interactive terminal viewer of a PyTorch memory snapshot (the pickle\n"
      "torch.cuda.memory._dump_snapshot writes) or a CSV trace (.csv / .csv.gz). An OOM snapshot\n"
      "opens on its verdict. Views: 1 Summary (OOM verdict), 2 Segments (address-order map),\n"
      "3 Timeline (allocated / reserved; moving its cursor replays the trace and every view\n"
      "follows), 4 Live allocations by call site, 5 what pins each segment, 6 Diff, 7 Active\n"
      "(live memory over time stacked by call site, function or op, with zoom in time).\n"
      "\n"
      "options:\n"
      "  --at MOMENT    where the cursor starts (default: the OOM, else the end): oom, peak,\n"
      "                 alloc-peak, entry:N, time:T (T with a unit: 2.5s, 300ms, 40us)\n"
      "  --diff FILE2   a second snapshot or trace; the Diff view compares FILE at its cursor with\n"
      "                 FILE2 at its own cursor (which starts at its OOM, or its end; in the Diff\n"
      "                 view b makes the stepping keys move it)\n"
      "  --report       print a text rendering of every view to stdout and exit (no terminal\n"
      "                 needed: for logs and CI)\n"
      "  --width N      columns of the --report rendering (default 120)\n"
      "  --colors MODE  auto (default), 256, 8 or none (monochrome)\n"
      "  --device N     which device's trace to take from a snapshot (default: the first with\n"
      "                 entries); -1 = pinned host memory\n"
      "  -h, --help     show this help\n"
      "\n"
      "Exit status: 0 on success, 1 if a file cannot be read or there is no terminal, 2 for a\n"
      "usage error.\n";
}

struct ViewArgs {
  std::string file;
  std::string diff;
  bool report = false;
  int width = 120;
  std::string colors = "auto";
  std::optional<int> device;
  std::string at;
};

int run_view(const std::vector<std::string_view>& argv) {
  ViewArgs a;
  CommandLine cl("view", help_text());
  cl.positional(a.file, "file", "gpumem view FILE (a snapshot .pickle or a trace .csv.gz)",
                " (to compare two, use --diff)");
  cl.flag("--report", a.report);
  cl.value("--diff", a.diff);
  cl.value("--at", a.at);
  cl.integer("--width", 40, 1000, a.width);
  cl.integer("--device", -1, 1024, a.device);
  cl.choice("--colors", {"auto", "256", "8", "none"}, a.colors);
  if (const auto status = cl.parse(argv)) return *status;
  std::optional<forensics::MomentSpec> at;
  if (!a.at.empty()) {
    std::string error;
    at = forensics::parse_moment(a.at, &error);
    if (!at) return cl.usage_error(fmt::format("--at: {}", error));
  }
#if GPUMEM_HAVE_VIEWER
  namespace vw = gpumem::view;
  try {
    auto model = vw::ViewerModel::open(a.file, a.device);
    if (!a.diff.empty()) {
      model.compare = std::make_shared<const vw::ViewerModel>(vw::ViewerModel::open(a.diff));
    }
    const std::size_t cursor = at ? model.cursor_at(*at) : model.initial_cursor();
    if (a.report) {
      std::fputs(vw::text_report(model, a.width, cursor).c_str(), stdout);
      return 0;
    }
    const vw::ColorMode colors = a.colors == "256"    ? vw::ColorMode::c256
                                 : a.colors == "8"    ? vw::ColorMode::c8
                                 : a.colors == "none" ? vw::ColorMode::mono
                                                      : vw::ColorMode::automatic;
    vw::ViewState state = vw::initial_state(model, vw::Size{80, 24});
    state.cursor = cursor;
    return vw::run_terminal(model, state, colors);
  } catch (const forensics::ForensicsError& e) {
    std::fprintf(stderr, "gpumem view: %s\n", e.what());
    return 1;
  }
#else
  std::fputs("gpumem view: this gpumem was built without the viewer (it needs ncurses: install libncurses-dev "
             "and configure with -DGPUMEM_WITH_VIEWER=ON)\n",
             stderr);
  return 1;
#endif
}

}  // namespace

Command view_command() {
  return {"view", "terminal viewer of a snapshot or trace (segments, timeline, live, active memory, OOM verdict)", &run_view};
}

}  // namespace gpumem::cli
