"""The Textual console: screens draw core's immutable snapshots; thread workers call core."""
