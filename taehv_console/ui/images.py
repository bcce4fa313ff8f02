"""The widgets that draw images (the Samples view's strips), from textual-image.

textual-image asks the terminal what it can draw (Sixel? Kitty graphics? cell size in pixels) when
it is imported, which works only before Textual starts reading the keyboard: so this module sits
at the top of the screens' imports, which ui.app loads before the app runs. A terminal that does
not answer costs up to ~0.3 s of queries here and is drawn with half-blocks; textual-image's
warning about it (a traceback printed under the TUI) is silenced, as the assumed cell size only
scales the picture."""

from __future__ import annotations

import logging

from textual.widget import Widget

logging.getLogger("textual_image").addHandler(logging.NullHandler())

# after the silencing: importing it asks the terminal
from textual_image.widget import HalfcellImage, SixelImage, TGPImage
from textual_image.widget import Image as AutoImage

# the settings file's `images` (ui/config.py: IMAGE_MODES) -> the widget that draws them
IMAGE_WIDGETS: dict[str, type[Widget]] = {
    "auto": AutoImage,
    "kitty": TGPImage,
    "sixel": SixelImage,
    "half-blocks": HalfcellImage,
}
