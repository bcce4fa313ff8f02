"""Wizard step 1, Detect: where the node list comes from (this machine, a platform's env, or a
hostfile), then every node's facts filling in as its probe answers. Unknown SSH host keys are
offered for trust here (fingerprint shown, added on confirmation)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import DataTable, Footer, Input, Label, ProgressBar, Static

from taehv_console.commands.detect import gpu_summary as gpu_list
from taehv_console.core.cluster.ssh import SshError
from taehv_console.core.flow.detect import detect, hostfile_topology, probe_each, probe_paths
from taehv_console.core.flow.trust import (
    HostKeyOffer,
    TrustOutcome,
    needs_trust,
    offer_host_key,
    trust_offered_key,
)
from taehv_console.core.models import NodeFacts, ProbeResult, Topology
from taehv_console.ui import formatting as f
from taehv_console.ui.errors import USER_ERRORS
from taehv_console.ui.messages import (
    DetectionFailed,
    DetectionFinished,
    HostTrusted,
    NodeProbed,
    TopologyDetected,
)
from taehv_console.ui.screens.base import ConsoleScreen
from taehv_console.ui.screens.dialogs import ConfirmScreen, MessageScreen
from taehv_console.ui.screens.preflight import PreflightScreen
from taehv_console.ui.widgets.steps import WizardSteps

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.ui.apptype import ConsoleApp

COLUMNS = ("node", "slots", "GPUs", "driver/CUDA", "CPU/RAM", "torch · ds · acc", "probe")


def gpu_summary(facts: NodeFacts) -> str:
    """The GPUs, or "0 — no NVML": why there are none in words that fit (the whole reason: i)."""
    return gpu_list(facts) if facts.visible_gpu_count else f"0 — {f.no_gpu_words(facts.gpu_reason)}"


def node_row(result: ProbeResult | None, slots: int | None) -> tuple[str | Content, ...]:
    slot_text = str(slots) if slots else "-"
    if result is None:
        return ("", slot_text, Content.styled("probing …", "dim"), "", "", "", "")
    facts = result.facts
    if facts is None:  # not result.ok
        label = "host key unknown" if "taehv-console trust" in (result.fix or "") else "unreachable"
        return (
            result.host,
            slot_text,
            f.badge("failed") + Content(f" {label}"),
            "",
            "",
            "",
            f"{result.seconds:.2f}s",
        )
    versions = " · ".join(
        v or "none" for v in (facts.torch_version, facts.deepspeed_version, facts.accelerate_version)
    )
    return (
        result.host,
        slot_text,
        gpu_summary(facts),
        f"{facts.driver_version or '-'}/{facts.cuda_driver_version or '-'}",
        f"{facts.cpu_count}/{facts.ram_gb:.0f}G",
        versions,
        f"{result.seconds:.2f}s",
    )


def topology_text(topology: Topology) -> Content:
    parts: list[str | Content] = [
        Content.styled("topology ", "dim"),
        Content.styled(topology.source.value, "bold"),
        f" — {topology.detail}",
        "\n",
        Content.styled("nodes ", "dim"),
        str(topology.node_count),
        Content.styled("  master ", "dim"),
        f"{topology.master_addr}:{topology.master_port}",
    ]
    if topology.processes_per_node:
        parts += [Content.styled("  processes/node ", "dim"), str(topology.processes_per_node)]
    for note in topology.notes:
        parts += ["\n", Content.styled("note ", "$warning"), note]
    return Content.assemble(*parts)


def problems_text(probes: tuple[ProbeResult | None, ...]) -> Content:
    lines = []
    for p in probes:
        if p is None or p.ok:
            continue
        error = p.error.removeprefix(f"{p.host}: ")  # the host is named once
        lines.append(Content.assemble(f.badge("failed"), " ", Content.styled(p.host, "bold"), f": {error}"))
        if p.fix:
            fix = p.fix
            if "taehv-console trust " in fix and "--replace" not in fix:
                fix = "select the row and press T to see its fingerprint and trust it"
            lines.append(Content.assemble(Content.styled("    fix: ", "dim"), fix))
    return Content("\n").join(lines)


class DetectScreen(ConsoleScreen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "wizard.tcss"
    # textual declares it "ClassVar[...] | None", which mypy reads as an instance variable
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (100, "-wide")]  # type: ignore[misc]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "next_step", "Continue", id="next-step", tooltip="Preflight checks on these nodes"),
        Binding("r", "detect", "Detect again", id="redetect", tooltip="Probe every node again"),
        Binding(
            "T",
            "trust_host",
            "Trust host key",
            id="trust-host",
            tooltip="Show the selected node's SSH host key fingerprint and trust it",
        ),
        Binding(
            "i",
            "gpu_reason",
            "Why no GPU",
            id="gpu-reason",
            tooltip="The whole reason the selected node shows no GPU",
        ),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._results: dict[str, ProbeResult] = {}
        self._hosts: tuple[str, ...] = ()
        self._slots: dict[str, int | None] = {}

    def compose(self) -> ComposeResult:
        yield WizardSteps(0, classes="steps")
        with Horizontal(classes="field-row"):
            yield Label("hostfile", classes="field-label")
            yield Input(
                placeholder="empty: this machine (or the platform's env); else a DeepSpeed hostfile",
                id="hostfile",
                compact=True,
            )
        yield Static("", id="topology")
        yield ProgressBar(total=1, show_eta=False, id="probe-progress")
        yield DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
        yield Static("", id="problems")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one("#nodes", DataTable)
        table.add_columns(*COLUMNS)
        self.query_one("#hostfile", Input).value = self.app.options.hosts or ""
        wizard = self.app.wizard
        if wizard.topology is not None:
            self._show_topology(wizard.topology, tuple(p.host for p in wizard.probes))
            for p in wizard.probes:
                self._show_probe(p)
            self._finish(wizard.topology, wizard.probes)
        else:
            self.action_detect()
        table.focus()

    # ---------------------------------------------------------------- detection
    def action_detect(self) -> None:
        self.app.wizard.topology = None
        self.app.wizard.probes = ()
        self._results.clear()
        self.query_one("#nodes", DataTable).clear()
        self.query_one("#problems", Static).update("")
        self.query_one("#topology", Static).update(Content.styled("detecting …", "dim"))
        self.query_one("#probe-progress", ProgressBar).update(total=None, progress=0)
        self._detect(self.query_one("#hostfile", Input).value.strip() or None)

    @work(thread=True, exclusive=True, group="detect", exit_on_error=False)
    def _detect(self, hostfile: str | None) -> None:
        options = dataclasses.replace(self.app.options, hosts=hostfile)
        try:
            if hostfile:
                topology = hostfile_topology(options)
                self.post_message(TopologyDetected(topology, tuple(topology.hosts)))
                probes = probe_each(
                    tuple(topology.hosts),
                    self.app.pool,
                    probe_paths(options),
                    lambda r: self.post_message(NodeProbed(r)),
                )
            else:
                found = detect(options)
                topology, probes = found.topology, found.probes
        except USER_ERRORS as err:  # errors.py's table: a bad hostfile, topology, host name
            self.post_message(DetectionFailed(str(err)))
            return
        self.post_message(DetectionFinished(topology, probes))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "hostfile":
            self.app.options = dataclasses.replace(self.app.options, hosts=event.value.strip() or None)
            self.action_detect()
            self.query_one("#nodes", DataTable).focus()

    def on_topology_detected(self, message: TopologyDetected) -> None:
        self._show_topology(message.topology, message.hosts)

    def _show_topology(self, topology: Topology, hosts: tuple[str, ...]) -> None:
        self._hosts = hosts
        self._slots = {n.host: n.slots for n in topology.nodes}
        self.query_one("#topology", Static).update(topology_text(topology))
        table = self.query_one("#nodes", DataTable)
        table.clear()
        for h in hosts:
            row = node_row(None, self._slots.get(h))
            table.add_row(*f.table_row((h, *row[1:])), key=h)
        self.query_one("#probe-progress", ProgressBar).update(total=max(1, len(hosts)), progress=0)

    def on_node_probed(self, message: NodeProbed) -> None:
        self._show_probe(message.result)

    def _show_probe(self, result: ProbeResult) -> None:
        self._results[result.host] = result
        table = self.query_one("#nodes", DataTable)
        row = node_row(result, self._slots.get(result.host))
        if result.host in table.rows:
            for col, value in zip(table.columns, row, strict=False):
                table.update_cell(result.host, col, f.table_cell(value))
        else:
            table.add_row(*f.table_row(row), key=result.host)
        self.query_one("#probe-progress", ProgressBar).update(
            total=max(1, len(self._hosts) or 1), progress=len(self._results)
        )
        self.query_one("#problems", Static).update(problems_text(tuple(self._results.values())))
        self.refresh_bindings()

    def on_detection_finished(self, message: DetectionFinished) -> None:
        if not self._hosts:
            self._show_topology(message.topology, tuple(p.host for p in message.probes))
        for p in message.probes:
            self._show_probe(p)
        self._finish(message.topology, message.probes)

    def _finish(self, topology: Topology, probes: tuple[ProbeResult, ...]) -> None:
        self.app.wizard.topology = topology
        self.app.wizard.probes = tuple(probes)
        ok = sum(1 for p in probes if p.ok)
        self.query_one("#probe-progress", ProgressBar).update(total=max(1, len(probes)), progress=len(probes))
        self.query_one("#nodes", DataTable).border_subtitle = f"{ok} of {len(probes)} node(s) answered"

    def on_detection_failed(self, message: DetectionFailed) -> None:
        self.query_one("#topology", Static).update(Content.assemble(f.badge("failed"), " ", message.message))
        self.query_one("#probe-progress", ProgressBar).update(total=1, progress=0)

    def _no_gpu_reason(self) -> tuple[str, str] | None:
        """(host, why it shows no GPU) for the selected node, or None when it has GPUs or no answer."""
        table = self.query_one("#nodes", DataTable)
        if not table.row_count:
            return None
        host = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        result = self._results.get(host) if host is not None else None
        facts = result.facts if result is not None else None
        if host is None or facts is None or facts.visible_gpu_count:
            return None
        return host, facts.gpu_reason or "none visible"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self._no_gpu_reason() is not None if action == "gpu_reason" else True  # i: only then

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()

    def action_gpu_reason(self) -> None:
        found = self._no_gpu_reason()
        if found is not None:
            self.app.push_screen(MessageScreen(f"{found[0]}: no GPU", found[1], severity="info"))

    # ---------------------------------------------------------------- trust
    def action_trust_host(self) -> None:
        table = self.query_one("#nodes", DataTable)
        if not table.row_count:
            return
        host = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        result = self._results.get(host) if host is not None else None
        if result is None or not needs_trust(result):
            self.notify(
                f"{host}: its host key is not the problem"
                if result is not None and not result.ok
                else f"{host}: nothing to trust",
                severity="warning",
            )
            return
        self._fingerprint(host)

    @work(thread=True, exclusive=True, group="trust", exit_on_error=False)
    def _fingerprint(self, host: str) -> None:
        try:
            offer = offer_host_key(host, self.app.options.ssh)
        except SshError as err:
            self.post_message(HostTrusted(host, f"cannot read {host}'s key: {err}"))
            return
        self.app.call_from_thread(self._ask_trust, offer)

    def _ask_trust(self, offer: HostKeyOffer) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._add_trust(offer)

        where = self.app.options.ssh.known_hosts
        body = (
            f"{offer.line}\n\nCompare it with the node's own key (on the node: ssh-keygen -lf "
            f"/etc/ssh/ssh_host_{offer.key_type.split('-')[-1]}_key.pub). Trusting adds this key to {where}."
        )
        self.app.push_screen(ConfirmScreen(f"Trust {offer.host}?", body, yes="Trust"), answered)

    @work(thread=True, exclusive=True, group="trust", exit_on_error=False)
    def _add_trust(self, offer: HostKeyOffer) -> None:
        """Add exactly the key the user confirmed; the probe that follows then connects only if
        the host still presents that key."""
        settings = self.app.options.ssh
        outcome = trust_offered_key(offer, settings)
        added = f"{offer.host}: {offer.fingerprint} added to {settings.known_hosts}"
        text = {
            TrustOutcome.ADDED: added,
            TrustOutcome.REPLACED: added,
            TrustOutcome.ALREADY: f"{offer.host}: already trusted in {settings.known_hosts}",
            TrustOutcome.REFUSED_CHANGED: (
                f"{offer.host}: {settings.known_hosts} holds a different key for it; refused here. Check with "
                f"the node's admin, then: taehv-console trust --replace {offer.host}"
            ),
        }[outcome]
        self.post_message(HostTrusted(offer.host, text))
        probe_each(
            (offer.host,),
            self.app.pool,
            probe_paths(self.app.options),
            lambda r: self.post_message(NodeProbed(r)),
        )

    def on_host_trusted(self, message: HostTrusted) -> None:
        self.notify(message.message, title="host key")

    # ---------------------------------------------------------------- navigation
    def action_next_step(self) -> None:
        wizard = self.app.wizard
        if wizard.topology is None:
            self.notify("detection has not finished", severity="warning")
            return
        probes = tuple(self._results.get(p.host, p) for p in wizard.probes)
        wizard.probes = probes
        if not any(p.ok for p in probes):
            self.notify("no node answered: fix the problems listed, then detect again (r)", severity="error")
            return
        wizard.preflight = None
        self.app.push_screen(PreflightScreen())
