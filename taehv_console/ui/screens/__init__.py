"""Screens: the wizard steps, the dashboard, node drill-down, help and dialogs."""
