"""The widgets that draw images (the Samples view's strips), from textual-image.

textual-image asks the terminal what it can draw (Sixel? Kitty graphics? cell size in pixels) when
it is imported, which works only before Textual starts reading the keyboard: so this module sits
at the top of the screens' imports, which ui.app loads before the app runs. A terminal that does
not answer costs up to ~0.3 s of queries here and is drawn with half-blocks; textual-image's
warning about it (a traceback printed under the TUI) is silenced, as the assumed cell size only
scales the picture."""

from __future__ import annotations

import logging
import sys

from textual.widget import Widget
from textual_image import _terminal as image_terminal  # defines only: asks the terminal nothing

logging.getLogger("textual_image").addHandler(logging.NullHandler())


def _cell_size_for_a_terminal_of_no_size() -> None:
    """textual-image divides the terminal's size in pixels by its columns and rows: a terminal that
    reports 0 of them (`docker exec -it` or `kubectl exec -it` before their first resize) made the
    import raise ZeroDivisionError, and the console never started. Such a terminal gets the cell
    size textual-image assumes when it cannot tell (VT340's 10×20 pixels)."""
    if not (sys.__stdout__ and sys.__stdout__.isatty()):
        return
    try:
        rows, columns, _w, _h = image_terminal.get_tiocgwinsz()
    except (OSError, ValueError):
        return  # textual-image asks again, and falls back itself
    if rows == 0 or columns == 0:
        image_terminal.get_cell_size._result = image_terminal.CellSize(10, 20)  # type: ignore[attr-defined]


_cell_size_for_a_terminal_of_no_size()

# after the silencing and the guard: importing it asks the terminal
from textual_image.widget import HalfcellImage, SixelImage, TGPImage
from textual_image.widget import Image as AutoImage

# the settings file's `images` (ui/config.py: IMAGE_MODES) -> the widget that draws them
IMAGE_WIDGETS: dict[str, type[Widget]] = {
    "auto": AutoImage,
    "kitty": TGPImage,
    "sixel": SixelImage,
    "half-blocks": HalfcellImage,
}
