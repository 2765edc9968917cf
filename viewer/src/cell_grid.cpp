#include "gpumem/view/cell_grid.h"

#include <algorithm>

namespace gpumem::view {

CellGrid::CellGrid(Size size)
    : size_{size.width < 0 ? 0 : size.width, size.height < 0 ? 0 : size.height},
      cells_(static_cast<std::size_t>(size_.width) * static_cast<std::size_t>(size_.height)) {}

void CellGrid::set(int x, int y, Cell cell) noexcept {
  if (x < 0 || y < 0 || x >= size_.width || y >= size_.height) return;
  cells_[static_cast<std::size_t>(y * size_.width + x)] = cell;
}

int CellGrid::put(int x, int y, std::string_view utf8, Style style, int max_width) noexcept {
  const int limit = max_width < 0 ? size_.width : std::min(size_.width, x + max_width);
  for (char32_t ch : decode_utf8(utf8)) {
    if (x >= limit) break;
    if (ch < 0x20 || ch == 0x7f) ch = U' ';
    if (display_width(ch) == 2) {
      if (x + 1 >= limit) break;  // half a wide character would not fit
      set(x, y, Cell{ch, style});
      set(x + 1, y, Cell{kWideTail, style});
      x += 2;
      continue;
    }
    set(x, y, Cell{ch, style});
    ++x;
  }
  return x;
}

void CellGrid::restyle(int x, int y, int count, Style style) noexcept {
  if (y < 0 || y >= size_.height) return;
  for (int i = std::max(0, x); i < std::min(size_.width, x + count); ++i) {
    cells_[static_cast<std::size_t>(y * size_.width + i)].style = style;
  }
}

void CellGrid::fill_row(int y, char32_t ch, Style style) noexcept {
  for (int x = 0; x < size_.width; ++x) set(x, y, Cell{ch, style});
}

std::string CellGrid::row_text(int y) const {
  std::string line;
  for (int x = 0; x < size_.width; ++x) {
    if (at(x, y).ch != kWideTail) append_utf8(line, at(x, y).ch);
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

std::string CellGrid::to_text() const {
  std::string out;
  for (int y = 0; y < size_.height; ++y) {
    out += row_text(y);
    out += '\n';
  }
  return out;
}

int display_width(char32_t c) noexcept {
  const auto in = [c](char32_t lo, char32_t hi) { return c >= lo && c <= hi; };
  return in(0x1100, 0x115F) || in(0x2E80, 0x303E) || in(0x3041, 0x33FF) || in(0x3400, 0x4DBF) ||
                 in(0x4E00, 0x9FFF) || in(0xA000, 0xA4CF) || in(0xAC00, 0xD7A3) || in(0xF900, 0xFAFF) ||
                 in(0xFE30, 0xFE4F) || in(0xFF00, 0xFF60) || in(0xFFE0, 0xFFE6) || in(0x1F300, 0x1F64F) ||
                 in(0x1F900, 0x1F9FF) || in(0x20000, 0x3FFFD)
             ? 2
             : 1;
}

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      out.push_back(U'\uFFFD');
      ++i;
      continue;
    }
    if (i + static_cast<std::size_t>(extra) >= s.size()) {
      out.push_back(U'\uFFFD');
      break;
    }
    bool ok = true;
    for (int k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((d & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(ok ? cp : U'\uFFFD');
    i += static_cast<std::size_t>(ok ? extra + 1 : 1);
  }
  return out;
}

void append_utf8(std::string& out, char32_t ch) {
  const auto c = static_cast<std::uint32_t>(ch);
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace gpumem::view
