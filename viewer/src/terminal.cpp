#include "gpumem/view/terminal.h"

#include <unistd.h>

#include <array>
#include <clocale>
#include <cstdio>
#include <optional>

#ifndef NCURSES_WIDECHAR
#define NCURSES_WIDECHAR 1
#endif
#include <curses.h>

#include "gpumem/view/render.h"

namespace gpumem::view {
namespace {

struct Look {
  short fg = -1, bg = -1;
  attr_t attrs = A_NORMAL;
};

constexpr int kStyles = static_cast<int>(Style::count_);

// What each style looks like with 256 colors, 8 colors, and none.
Look look_for(Style s, ColorMode mode) {
  const bool c256 = mode == ColorMode::c256;
  switch (s) {
    case Style::normal: return {};
    case Style::title: return mode == ColorMode::mono ? Look{-1, -1, A_REVERSE} : Look{c256 ? short(231) : short(COLOR_WHITE), c256 ? short(24) : short(COLOR_BLUE), A_BOLD};
    case Style::tab: return mode == ColorMode::mono ? Look{-1, -1, A_DIM} : Look{c256 ? short(250) : short(COLOR_WHITE), -1, A_NORMAL};
    case Style::tab_active: return mode == ColorMode::mono ? Look{-1, -1, A_REVERSE | A_BOLD} : Look{COLOR_BLACK, c256 ? short(214) : short(COLOR_YELLOW), A_BOLD};
    case Style::help: return mode == ColorMode::mono ? Look{-1, -1, A_REVERSE} : Look{COLOR_BLACK, c256 ? short(250) : short(COLOR_WHITE), A_NORMAL};
    case Style::dim: return mode == ColorMode::mono ? Look{-1, -1, A_DIM} : Look{c256 ? short(244) : short(COLOR_WHITE), -1, c256 ? A_NORMAL : A_DIM};
    case Style::emphasis: return mode == ColorMode::mono ? Look{-1, -1, A_BOLD} : Look{c256 ? short(117) : short(COLOR_CYAN), -1, A_BOLD};
    case Style::warn: return mode == ColorMode::mono ? Look{-1, -1, A_BOLD | A_UNDERLINE} : Look{c256 ? short(203) : short(COLOR_RED), -1, A_BOLD};
    case Style::selected: return {-1, -1, A_REVERSE};
    case Style::allocated: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(203) : short(COLOR_RED), -1, A_NORMAL};
    case Style::inactive_split: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(214) : short(COLOR_YELLOW), -1, A_NORMAL};
    case Style::cached_free: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(75) : short(COLOR_BLUE), -1, A_NORMAL};
    case Style::partly_used: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(177) : short(COLOR_MAGENTA), -1, A_NORMAL};
    case Style::unmapped: return mode == ColorMode::mono ? Look{-1, -1, A_DIM} : Look{c256 ? short(240) : short(COLOR_WHITE), -1, A_DIM};
    case Style::chart_reserved: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(75) : short(COLOR_CYAN), -1, A_NORMAL};
    case Style::chart_allocated: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(114) : short(COLOR_GREEN), -1, A_NORMAL};
    case Style::cursor: return mode == ColorMode::mono ? Look{-1, -1, A_BOLD | A_REVERSE} : Look{c256 ? short(226) : short(COLOR_YELLOW), -1, A_BOLD};
    // The Active view's layers take the colors the other views already use, one per group.
    case Style::stack_1: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(203) : short(COLOR_RED), -1, A_NORMAL};
    case Style::stack_2: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(114) : short(COLOR_GREEN), -1, A_NORMAL};
    case Style::stack_3: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(75) : short(COLOR_BLUE), -1, A_NORMAL};
    case Style::stack_4: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(214) : short(COLOR_YELLOW), -1, A_NORMAL};
    case Style::stack_5: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(177) : short(COLOR_MAGENTA), -1, A_NORMAL};
    case Style::stack_6: return mode == ColorMode::mono ? Look{} : Look{c256 ? short(117) : short(COLOR_CYAN), -1, A_NORMAL};
    case Style::stack_other: return mode == ColorMode::mono ? Look{-1, -1, A_DIM} : Look{c256 ? short(244) : short(COLOR_WHITE), -1, c256 ? A_NORMAL : A_DIM};
    case Style::count_: break;
  }
  return {};
}

class Painter {
 public:
  explicit Painter(ColorMode requested) {
    ColorMode mode = requested;
    if (!has_colors()) mode = ColorMode::mono;
    if (mode != ColorMode::mono) {
      start_color();
      use_default_colors();
      if (mode == ColorMode::automatic) mode = COLORS >= 256 ? ColorMode::c256 : (COLORS >= 8 ? ColorMode::c8 : ColorMode::mono);
      if (mode == ColorMode::c256 && COLORS < 256) mode = ColorMode::c8;
    }
    for (int i = 0; i < kStyles; ++i) {
      const Look l = look_for(static_cast<Style>(i), mode);
      attrs_[static_cast<std::size_t>(i)] = l.attrs;
      pairs_[static_cast<std::size_t>(i)] = 0;
      if (mode != ColorMode::mono && (l.fg != -1 || l.bg != -1) && i + 1 < COLOR_PAIRS) {
        init_pair(static_cast<short>(i + 1), l.fg, l.bg);
        pairs_[static_cast<std::size_t>(i)] = static_cast<short>(i + 1);
      }
    }
  }

  void paint(const CellGrid& g) const {
    for (int y = 0; y < g.height(); ++y) {
      for (int x = 0; x < g.width(); ++x) {
        const Cell& c = g.at(x, y);
        if (c.ch == kWideTail) continue;  // drawn by the wide character to its left
        const auto si = static_cast<std::size_t>(c.style);
        wchar_t text[2] = {static_cast<wchar_t>(c.ch), L'\0'};
        cchar_t cc;
        setcchar(&cc, text, attrs_[si], pairs_[si], nullptr);
        mvadd_wch(y, x, &cc);  // the bottom-right cell may report an error; it is drawn anyway
      }
    }
    refresh();
  }

 private:
  std::array<attr_t, kStyles> attrs_{};
  std::array<short, kStyles> pairs_{};
};

std::optional<Key> key_from(int kind, wint_t ch) {
  if (kind == KEY_CODE_YES) {
    switch (ch) {
      case KEY_UP: return Key::of(KeyCode::up);
      case KEY_DOWN: return Key::of(KeyCode::down);
      case KEY_LEFT: return Key::of(KeyCode::left);
      case KEY_RIGHT: return Key::of(KeyCode::right);
      case KEY_PPAGE: return Key::of(KeyCode::page_up);
      case KEY_NPAGE: return Key::of(KeyCode::page_down);
      case KEY_HOME: return Key::of(KeyCode::home);
      case KEY_END: return Key::of(KeyCode::end);
      case KEY_ENTER: return Key::of(KeyCode::enter);
      case KEY_BACKSPACE: return Key::of(KeyCode::backspace);
      case KEY_BTAB: return Key::of(KeyCode::tab);
      default: return std::nullopt;
    }
  }
  if (kind != OK) return std::nullopt;
  switch (ch) {
    case L'\n':
    case L'\r': return Key::of(KeyCode::enter);
    case 27: return Key::of(KeyCode::escape);
    case 127:
    case 8: return Key::of(KeyCode::backspace);
    case L'\t': return Key::of(KeyCode::tab);
    default: return Key::chr(static_cast<char32_t>(ch));
  }
}

}  // namespace

int run_terminal(const ViewerModel& model, ViewState state, ColorMode colors) {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    std::fputs("gpumem view: stdin and stdout must be a terminal for the interactive viewer; use --report to print a text rendering\n",
               stderr);
    return 1;
  }
  std::setlocale(LC_ALL, "");
  set_escdelay(25);
  if (!initscr()) {
    std::fputs("gpumem view: cannot initialize the terminal (is TERM set?)\n", stderr);
    return 1;
  }
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  {
    const Painter painter(colors);
    int h = 0, w = 0;
    getmaxyx(stdscr, h, w);
    state = reduce(state, Key::resized(Size{w, h}), model);
    while (!state.quit) {
      painter.paint(render(state, model, state.screen));
      // While the OOM report is computed in the background, wake up to show it when it lands.
      const bool pending = model.oom_report_pending();
      timeout(pending ? 200 : -1);
      wint_t ch = 0;
      const int kind = get_wch(&ch);
      if (kind == ERR) continue;
      if (kind == KEY_CODE_YES && ch == KEY_RESIZE) {
        getmaxyx(stdscr, h, w);
        erase();
        state = reduce(state, Key::resized(Size{w, h}), model);
        continue;
      }
      if (const auto key = key_from(kind, ch)) state = reduce(state, *key, model);
    }
  }
  endwin();
  return 0;
}

}  // namespace gpumem::view
