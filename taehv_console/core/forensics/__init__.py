"""Hang forensics: on a confirmed stall, the stalled rank's and a healthy peer's Python stacks
(py-spy), PyTorch's Flight Recorder dumps and analysis, and NCCL RAS's verdict, where each exists."""

from taehv_console.core.forensics.collect import StallForensics
from taehv_console.core.forensics.report import ForensicsReport, RankRef, StackDump

__all__ = ["ForensicsReport", "RankRef", "StackDump", "StallForensics"]
