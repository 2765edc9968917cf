// CellGrid: what one frame of the viewer looks like, as a width x height grid of cells. render()
// produces it; the terminal painter only copies it to the screen, and tests compare its text.
//
// A cell holds one Unicode code point and a semantic Style. A wide character (CJK, emoji: two
// columns) takes its cell and the next, which holds kWideTail; the painter skips those. The painter decides what a style looks like
// (256 colors, 8 colors or monochrome attributes); glyphs already tell states apart, so a
// monochrome screen loses nothing but color.
//
// Invariant: cells.size() == width * height; writes outside the grid are dropped.
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpumem::view {

enum class Style : std::uint8_t {
  normal,
  title,           // the top bar
  tab,             // an inactive tab name
  tab_active,      // the current view's tab
  help,            // the help line at the bottom
  dim,             // secondary text
  emphasis,        // numbers that matter
  warn,            // an OOM, a verdict
  selected,        // the selected row / block (reverse video)
  allocated,       // segment map: live block
  inactive_split,  // segment map: free bytes in a segment that also holds live blocks
  cached_free,     // segment map: free bytes in a segment with no live block
  partly_used,     // segment map: free bytes in a 2 MiB granule that also holds live bytes
  unmapped,        // segment map: reserved address range with nothing mapped
  chart_reserved,  // timeline: reserved bytes
  chart_allocated, // timeline: allocated bytes
  cursor,          // timeline cursor column
  stack_1,         // active view: the group with the highest peak
  stack_2,
  stack_3,
  stack_4,
  stack_5,
  stack_6,
  stack_other,     // active view: the groups after the top ones, together
  count_,
};

inline constexpr char32_t kWideTail = 0;  // the right half of a wide character

struct Cell {
  char32_t ch = U' ';
  Style style = Style::normal;
  bool operator==(const Cell&) const = default;
};

struct Size {
  int width = 0;
  int height = 0;
  bool operator==(const Size&) const = default;
};

class CellGrid {
 public:
  CellGrid() = default;
  explicit CellGrid(Size size);

  Size size() const noexcept { return size_; }
  int width() const noexcept { return size_.width; }
  int height() const noexcept { return size_.height; }

  const Cell& at(int x, int y) const { return cells_[static_cast<std::size_t>(y * size_.width + x)]; }
  void set(int x, int y, Cell cell) noexcept;
  // Writes UTF-8 text from (x, y), clipped at max_width columns (or the grid edge); returns the
  // column after the last character written.
  int put(int x, int y, std::string_view utf8, Style style = Style::normal, int max_width = -1) noexcept;
  // Sets the style of a run of cells, keeping their characters.
  void restyle(int x, int y, int count, Style style) noexcept;
  void fill_row(int y, char32_t ch, Style style) noexcept;

  // The frame as UTF-8 text: one line per row, trailing spaces trimmed.
  std::string to_text() const;
  std::string row_text(int y) const;

 private:
  Size size_;
  std::vector<Cell> cells_;
};

// Columns a code point takes on a terminal: 2 for East Asian wide and fullwidth characters and
// most emoji, 1 otherwise (the viewer writes no combining characters).
int display_width(char32_t ch) noexcept;

// Decodes UTF-8 into code points (invalid bytes become U+FFFD).
std::u32string decode_utf8(std::string_view utf8);
void append_utf8(std::string& out, char32_t ch);

}  // namespace gpumem::view
