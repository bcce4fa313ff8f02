"""Widgets that draw parts of a ClusterState."""
