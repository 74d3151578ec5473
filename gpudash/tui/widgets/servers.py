"""The two views that act on one selected server: Split balance, and Servers with the selected server's
log tail. Both are a `ServerPicker`: `s` moves the selection, `t`/`p`/`m` change the selected server, and
switching between the two carries the selection over."""

from __future__ import annotations

from typing import Any, Sequence
from urllib.parse import urlsplit

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Log, Static

from gpudash.advisor.planner import SplitPlan
from gpudash.config import ServerSpec
from gpudash.runtime.control import AttachServer, ServerAction, SetSplit
from gpudash.outside import printable
from gpudash.records import ServerSample, ServerState
from gpudash.tui import messages as msg
from gpudash.tui.state import ViewState, recommend_split, runs_plan, split_balance, split_servers, ts_ratios
from gpudash.tui.widgets import energy as energy_text
from gpudash.tui.widgets.fitted import FittedTable, NamesHiddenColumns, hidden_columns_line
from gpudash.tui.widgets.tables import TableView
from gpudash.tui.widgets.view import DashView, cycle
from gpudash import fmt

LOG_POLL_S = 1.0


STATE_STYLE = {ServerState.READY: "green", ServerState.CRASHED: "bold red", ServerState.BACKOFF: "yellow",
               ServerState.SLEEPING: "cyan", ServerState.RELAUNCHING: "bold magenta",
               ServerState.UNREACHABLE: "bold red", ServerState.NOT_A_SERVER: "bold red"}
GPU_ACTIONS = ("edit_split", "apply_plan", "edit_share")  # nothing a server does on the CPU alone


class ServerPicker(DashView):
    """A view with a selected server (the first one seen until `s` picks another) and the keys that change it.
    A server whose build cannot use GPUs is offered no GPU action (split, plan, share)."""

    selected_server: str | None = None
    KEYS_FOLLOW_STATE = True

    def offers(self, method: str) -> bool:
        return method not in GPU_ACTIONS or not self._on_cpu(self.selected_server)

    def _on_cpu(self, server: str | None) -> bool:
        return server is not None and self.state.runs_on_cpu(server)

    def _gpu_refusal(self, server: str) -> bool:
        """Say so (and True) when `server` runs a build that cannot use GPUs."""
        if not self._on_cpu(server):
            return False
        self.notify(f"{server} runs on the CPU: its llama.cpp build has no GPU offload "
                    f"({self.state.cpu_evidence(server)}); splits and memory shares do nothing there",
                    severity="warning", timeout=10)
        return True

    def shown(self, previous: DashView | None) -> None:
        if isinstance(previous, ServerPicker) and previous.selected_server not in (None, self.selected_server):
            self.selected_server = previous.selected_server
            self.show(self.state)

    def show(self, state: ViewState) -> None:
        if self.selected_server is None:
            names = state.server_names()
            self.selected_server = names[0] if names else None
        super().show(state)

    def action_select(self, step: int) -> None:
        names = self.state.server_names()
        if not names:
            self.notify("no servers to select")
            return
        self.selected_server = cycle(names, self.selected_server, step)
        self.show(self.state)
        self.app.refresh_keys()  # the GPU keys follow the selected server
        self.selection_moved()

    def action_select_server(self) -> None:
        self.action_select(1)

    def selection_moved(self) -> None:
        """The selected server changed (the Servers view fetches its log at once)."""

    def _selected_spec(self) -> ServerSpec | None:
        if self.selected_server is None or self.selected_server not in self.state.specs:
            self.notify("select a server first (s); none is known yet", severity="warning")
            return None
        return self.state.specs[self.selected_server]

    def action_edit_split(self) -> None:
        from gpudash.tui.screens.forms import SplitForm

        spec = self._selected_spec()
        if spec is None or self._gpu_refusal(spec.name):
            return
        gpus = self.state.server_gpus(spec)
        if gpus is None:
            self.notify("waiting for the first sample: the rig's GPUs are not known yet", severity="warning")
            return
        self.app.push_screen(SplitForm(spec, gpus), self.propose)

    def action_apply_plan(self) -> None:
        """Propose the split planner's -ts for the selected split server (or the only one), to confirm."""
        state, snap = self.state, self.state.latest
        servers = split_servers(state.specs.values(), len(snap.gpus)) if snap is not None else []
        if not servers:
            self.notify("no model is split across GPUs: nothing to plan", severity="warning")
            return
        spec = next((s for s in servers if s.name == self.selected_server), servers[0])
        if self._gpu_refusal(spec.name):
            return
        plan = recommend_split(spec, snap, state.model_bytes.get(spec.name))
        if isinstance(plan, str):
            self.notify(f"{spec.name}: {plan}", severity="warning", timeout=8)
            return
        if runs_plan(spec, plan):
            self.notify(f"{spec.name} already runs the planned split -ts {plan.ts}")
            return
        self.propose(SetSplit(spec.name, ts_ratios(plan.ts)))

    def action_edit_share(self) -> None:
        """The selected server's memory share of each of its GPUs."""
        from gpudash.tui.screens.forms import ShareForm

        spec = self._selected_spec()
        if spec is not None and not self._gpu_refusal(spec.name):
            self.app.push_screen(ShareForm(spec), self.propose)


class SplitView(ServerPicker, TableView):
    TITLE = "Split: target ratio vs memory held per GPU, and the planner's split (p: apply)"
    EMPTY = "no model is split across GPUs (set gpus / tensor_split in a [[servers]] entry)"
    COLUMNS = ("server", "GPU", "target", "held", "actual", "imbalance", "planned")

    def offers(self, method: str) -> bool:
        """`t` here edits a split that exists; the Servers tab's `t` splits a model that is on one GPU."""
        return (method != "edit_split" or self._split(self.selected_server)) and super().offers(method)

    def _split(self, server: str | None) -> bool:
        snap = self.state.latest
        return snap is not None and any(s.name == server for s in split_servers(self.state.specs.values(),
                                                                                 len(snap.gpus)))

    def action_edit_split(self) -> None:
        if not self._split(self.selected_server):
            self.notify(f"{self.selected_server or 'no server'} is not split across GPUs: nothing to edit here "
                        f"(t on Servers splits a model)", severity="warning")
            return
        super().action_edit_split()

    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield Static("", id="split-advice")
        yield Static("", id="share-warnings")
        yield Static("", id="server-warnings")

    def draw(self, state: ViewState) -> None:
        snap = state.latest
        rows: list[tuple[Any, ...]] = []
        advice = Text()
        if snap is not None:
            for spec in split_servers(state.specs.values(), len(snap.gpus)):
                if state.runs_on_cpu(spec.name):  # no GPU holds it: no balance, no plan
                    advice.append_text(_cpu_line(spec, state.cpu_evidence(spec.name)))
                    continue
                plan = recommend_split(spec, snap, state.model_bytes.get(spec.name))
                planned = {s.index: s.ratio for s in plan.shares} if not isinstance(plan, str) else {}
                for r in split_balance(spec, snap):
                    imb = Text("—") if r.imbalance is None else Text(
                        f"{r.imbalance * 100:+.1f} pts", style="bold red" if abs(r.imbalance) > 0.05 else "green")
                    name = Text(r.server, style="bold reverse" if r.server == self.selected_server else "")
                    rows.append((name, r.gpu, fmt.pct(r.target, 1), fmt.size(r.held_bytes),
                                 fmt.pct(r.actual, 1), imb, fmt.pct(planned.get(r.gpu), 1)))
                advice.append_text(_advice_line(spec, plan))
        self.fill(rows)
        self.query_one("#split-advice", Static).update(advice, layout=False)
        self.query_one("#share-warnings", Static).update(warnings_text(state.warnings))
        warned = self.query_one("#server-warnings", Static)
        warned.update(server_warnings_text(state.server_warnings))
        warned.display = bool(state.server_warnings)


def _advice_line(spec: ServerSpec, plan: SplitPlan | str) -> Text:
    """'big: -ts 1,1 now, planner -ts 2,3 (p: apply): why' - one line per split server."""
    now = ",".join(f"{r:g}" for r in ratios) if (ratios := spec.split_ratios()) else "equal"
    t = Text(f"{spec.name}: -ts {now} now, ", style="bold")
    if isinstance(plan, str):
        t.append(plan, style="yellow")
    else:
        same = runs_plan(spec, plan)
        t.append(f"planner -ts {plan.ts}", style="bold green" if same else "bold magenta")
        t.append(" (already applied)" if same else " (p: apply)")
        t.append(f": {plan.reason}")
    t.append("\n")
    return t


def _cpu_line(spec: ServerSpec, evidence: str) -> Text:
    """A split server whose build runs on the CPU: its -ts does nothing, and there is nothing to plan."""
    ts = ",".join(f"{r:g}" for r in spec.split_ratios() or ()) or "equal"
    t = Text(f"{spec.name}: -ts {ts} has no effect: ", style="bold")
    t.append(f"its llama.cpp build runs on the CPU (no GPU offload: {evidence})\n",
             style="bold yellow")
    return t


def server_warnings_text(warnings: dict[str, tuple[str, ...]]) -> Text:
    """What the servers' logs warned since they started, one line each (nothing when none did)."""
    lines = [(name, w) for name, ws in warnings.items() for w in ws]
    if not lines:
        return Text()
    t = Text(f"server warnings ({len(lines)}):\n", style="bold yellow")
    t.append("\n".join(f"  ! {name}: {w}" for name, w in lines), style="yellow")
    return t


def warnings_text(warnings: Sequence[Any]) -> Text:
    """The share warnings, one per line, in a warning colour (or a quiet line when there are none)."""
    if not warnings:
        return Text("share warnings: none", style="dim")
    t = Text(f"share warnings ({len(warnings)}):\n", style="bold yellow")
    t.append("\n".join(f"  ! {w.message}" for w in warnings), style="yellow")
    return t


# The Servers tab's keys that apply to a server of each origin: gpudash runs a managed one, only reads an
# attached one, and can attach or write down a found one.
ORIGIN_ACTIONS = {"managed": frozenset({"server"}), "attached": frozenset(),
                  "found": frozenset({"attach_found", "write_found"})}
# What the title says the selected server's keys are.
ORIGIN_KEYS = {"managed": "S/x/R start/stop/restart it", "attached": "attached: gpudash only reads it",
               "found": "A: attach it, W: write it to the config"}
# Why the keys that start, stop or signal a server do nothing for one gpudash did not start.
NOT_OURS = {"attached": "{name} is attached: gpudash only reads it and never starts, stops or signals it; do that "
                        "where it was started (systemd, docker, its shell)",
            "found": "{name} runs on this box but gpudash did not start it: A attaches it (gpudash reads it), W "
                     "writes it into the config; starting or stopping it is up to whoever runs it"}


def state_word(s: ServerSample) -> str:
    """A server's state in words, once: a launched one's state; an attached one's (or why its read failed),
    marked attached; a found one's health, marked found (it said "found (found)")."""
    if s.origin == "found":
        return {True: "up (found)", False: "no answer (found)"}.get(s.answers, "found")
    return str(s.state) if s.origin == "managed" else printable(f"{s.error or s.state} ({s.origin})")


def port_of(s: ServerSample) -> Any:
    """The port a server listens on: its own, else its url's ("—" when neither says)."""
    if s.port:
        return s.port
    try:
        return urlsplit(s.url or "").port or "—"
    except ValueError:
        return "—"


def detail_text(s: ServerSample) -> Text:
    """The selected server's figures an operator acts on, on one line each: KV use and capacity (each DP
    engine's), the requests that went wrong, its slots; unknown ones are left out."""
    t = Text()
    kv = [f"KV {s.kv_cache_usage:.0%}" if s.kv_cache_usage is not None else
          "KV layout unknown (a server elsewhere: its slots do not say whether they share one buffer)"
          if s.slot_states else None]
    if s.kv_capacity_tokens is not None:
        kv.append(f"of {s.kv_capacity_tokens:,.0f} tokens")
    if s.kv_cache_usage_engines:
        kv.append("(engines " + " ".join(f"{e:.0%}" for e in s.kv_cache_usage_engines) + ")")
    if s.requests_waiting_capacity:
        kv.append(f"| {s.requests_waiting_capacity:.0f} waiting for capacity")
    if any(kv):
        t.append(" ".join(x for x in kv if x) + "\n", style="bold red" if (s.kv_cache_usage or 0) > 0.95 else "")
    counts = [(label, v) for label, v in (("preempted", s.preemptions), ("aborted", s.requests_aborted),
                                         ("failed", s.requests_failed), ("refused", s.requests_rejected),
                                         ("corrupted", s.requests_corrupted)) if v is not None]
    if counts:
        t.append("since it started: " + ", ".join(f"{label} {v:.0f}" for label, v in counts)
                 + (f" of {s.requests_finished:.0f} finished" if s.requests_finished is not None else "") + "\n",
                 style="yellow" if any(v for _, v in counts) else "")
    if s.slot_states:
        t.append("slots: " + ", ".join(f"{i} {state} {held}/{n_ctx}" for i, state, held, n_ctx in s.slot_states)
                 + "\n")
    if s.rates_coarse:
        t.append("tok/s from counters that move only when a request ends (/slots is off: --no-slots)\n", style="dim")
    elif s.rate_window_s is not None:
        t.append(f"tok/s over the last {s.rate_window_s:.0f} s: a server counts a batch when it ends (llama-server "
                 "once per batch), so the figure lags a change of load by up to a batch\n", style="dim")
    if s.origin == "found" and s.error:
        t.append(printable(s.error) + "\n", style="yellow")
    t.rstrip()
    return t


class ServersView(NamesHiddenColumns, ServerPicker):
    """The launcher's servers, and the log tail of the selected one (fetched every LOG_POLL_S while on screen).
    Text from outside (an attached server's state and errors, a log's lines) is shown as text (outside.py)."""

    COLUMNS = ("server", "kind", "state", "port", "uptime", "tok/s 10s", "prefill tok/s 10s", "run/wait",
               "crashes", "relaunches", "KV use", "J/token 1m")
    # At 80 columns: server, state, the generation rate, requests running/waiting, crashes and KV use stay.
    DROP = ("kind", "port", "J/token 1m", "relaunches", "prefill tok/s 10s", "uptime")

    _log_chain = False  # a log fetch is scheduled or under way

    def compose(self) -> ComposeResult:
        yield Static("Servers", classes="view-title", id="servers-title")
        yield Static("", classes="empty")
        yield FittedTable(self.COLUMNS, self.DROP, id="servers-table")
        yield hidden_columns_line()
        yield Static("", id="server-detail")
        yield Static("", id="sleep-times")
        yield Static("log: no server selected", id="log-title", classes="view-title")
        log = Log(id="server-log", max_lines=200)
        log.can_focus = False
        yield log

    def draw(self, state: ViewState) -> None:
        snap = state.latest
        servers = snap.servers if snap is not None else ()
        names = [s.server for s in servers] or list(state.specs)
        table = self.query_one(FittedTable)
        by_name = {s.server: s for s in servers}
        energy = {e.server: e for e in (snap.server_energy if snap is not None else ())}
        rows: list[tuple[Any, ...]] = []
        for name in names:
            s = by_name.get(name)
            if s is None:
                spec = state.specs[name]
                rows.append((name, spec.kind, "not started", spec.port or "—", "—", "—", "—", "—", 0, 0, "—", "—"))
                continue
            style = STATE_STYLE.get(s.state, "") if s.origin != "found" else ("green" if s.answers else "bold red")
            ready = s.state is ServerState.READY  # only a serving server has rates; anything else would be stale
            kv = "not reported" if ready and s.kv_cache_usage is None else fmt.pct(s.kv_cache_usage if ready else None)
            # the sample's rate covers its own window; a recording from before windows had one rate per tick
            tok_s = s.tokens_per_s if s.rate_window_s is not None else state.tokens_per_s(name)
            rows.append((name, s.kind, Text(state_word(s), style=style), port_of(s),
                         fmt.duration(s.uptime_s if ready else None), fmt.num(tok_s if ready else None, ".1f"),
                         fmt.num(s.prompt_tokens_per_s if ready else None, ".1f"), _run_wait(s if ready else None),
                         s.restarts, s.relaunches, kv,
                         energy_text.per_token_cell(energy.get(name))))
        table.set_rows(rows)
        empty = self.query_one(".empty", Static)
        empty.display = not names
        empty.update("no servers yet: the demo starts when its llama-server is ready" if state.demo else
                     "no servers: none is configured and the demo is off (add a [[servers]] entry: a model to "
                     "run, or the url of one to read)")
        self.query_one("#sleep-times", Static).update(Text(_sleep_times(state.events)))
        selected = self.selected_server
        title = Text("Servers")
        row = by_name.get(selected) if selected is not None else None
        if selected in names:
            title.append("  selected: ")
            title.append(f" {selected} ", style="bold reverse")
            title.append(f"  (s: next; {ORIGIN_KEYS[row.origin if row is not None else 'managed']})")
        self.query_one("#servers-title", Static).update(title)
        detail = detail_text(row) if row is not None else Text()
        if selected in energy:
            detail.append(("\n" if detail else "") + energy_text.detail(energy[selected]))
        self.query_one("#server-detail", Static).update(detail)
        if selected in names:
            table.move_cursor(row=names.index(selected), animate=False)

    def offers(self, method: str) -> bool:
        """S/x/R/z/w for a server gpudash runs, A/W for a found one, none of them for an attached one."""
        if not any(method in acts for acts in ORIGIN_ACTIONS.values()):
            return super().offers(method)
        row = self._row(self.selected_server)
        if row is not None and row.origin == "attached" and self._attached_this_run(row.server):
            return method == "write_found"  # attached with A this run: W keeps it
        return method in ORIGIN_ACTIONS[row.origin if row is not None else "managed"]

    def _row(self, name: str | None) -> ServerSample | None:
        snap = self.state.latest
        return next((s for s in (snap.servers if snap else ()) if s.server == name), None)

    def _attached_this_run(self, name: str) -> bool:
        """Whether `name` was attached with A in this run (its server.attach event), not by the config."""
        return any(e.kind == "server.attach" and e.ok and e.target == name for e in self.state.events)

    def action_server(self, action: str) -> None:
        if self.selected_server is None:
            self.notify("no server selected (s selects one)", severity="warning")
            return
        row = self._row(self.selected_server)
        if row is not None and row.origin in NOT_OURS:
            self.notify(NOT_OURS[row.origin].format(name=self.selected_server), severity="warning", timeout=10)
            return
        self.propose(ServerAction(self.selected_server, action))  # type: ignore[arg-type]

    def _selected_found(self) -> ServerSample | None:
        """The selected row when it is a server found on the box, or one attached with `A` this run (not from
        the config), so "try it with A, keep it with W" works; else it says what to select."""
        row = self._row(self.selected_server)
        this_run = row is not None and row.origin == "attached" and self._attached_this_run(row.server)
        if row is None or row.url is None or not (row.origin == "found" or this_run):
            self.notify("select a found server first (s): one gpudash did not start and its config does not name",
                        severity="warning")
            return None
        return row

    def action_attach_found(self) -> None:
        """`A`: read the selected found server for the rest of this run (never signalled: attached)."""
        row = self._selected_found()
        if row is not None:
            self.propose(AttachServer(row.server, row.kind, str(row.url)))

    def action_write_found(self) -> None:
        """`W`: write the selected found server's [[servers]] entry (name, kind, url) into the config file."""
        row = self._selected_found()
        path = self.state.config_path
        if row is None:
            return
        if path is None:
            self.notify("no config file to write into (this run was started without one)", severity="warning")
            return
        entry = {"name": row.server, "kind": row.kind, "url": str(row.url)}

        def write() -> None:
            from gpudash.config import ConfigError, save_server

            try:
                save_server(path, entry)
                said, severity = (f"wrote [[servers]] {row.server} (url {row.url}) into {path}: the next launch "
                                  "reads it and so starts no demo"), "information"
            except (ConfigError, OSError, ValueError) as err:
                said, severity = f"cannot write {row.server} into {path}: {err}", "error"
            self.app.call_from_thread(self.notify, said, severity=severity)

        self.run_in_thread(write, "config.save_server", "config")

    # ---- the log tail: a chain (fetch in a worker -> show -> set_timer) while the view is on screen ----

    def shown(self, previous: DashView | None) -> None:
        super().shown(previous)
        if not self._log_chain:
            self._log_chain = True
            self._poll_log()

    def selection_moved(self) -> None:
        self._poll_log(rechain=False)

    def _poll_log(self, rechain: bool = True) -> None:
        feed = self.state.feed
        supervisor = feed.controller.supervisor if feed is not None and feed.controller is not None else None
        name = self.selected_server
        row = self._row(name)
        if self.on_screen and row is not None and row.origin != "managed":  # gpudash did not start it: no log
            self.query_one("#log-title", Static).update(Text(
                f"log: none here for {name}: gpudash did not start it ({row.origin}), so its output goes "
                "wherever its own launcher sends it"))
            self.query_one(Log).clear()
            if rechain:
                self.set_timer(LOG_POLL_S, self._poll_log)
            return
        if not self.on_screen or supervisor is None or name is None:
            if rechain:
                self._log_chain = False
            return
        self.run_in_thread(lambda: self.post_message(msg.LogTail(name, supervisor.log_tail(name, 200), rechain)),
                           "servers.log_tail", "logs")

    def worker_failed(self, name: str) -> None:
        if name == "servers.log_tail":
            self._log_chain = False

    def on_log_tail(self, message: msg.LogTail) -> None:
        message.stop()
        if message.server == self.selected_server:
            self.query_one("#log-title", Static).update(Text(f"log: {message.server} (last {len(message.lines)} lines)"))
            log = self.query_one(Log)
            log.clear()
            log.write_lines([printable(line) for line in message.lines])
        if message.rechain:
            self.set_timer(LOG_POLL_S, self._poll_log)


def _run_wait(s: ServerSample | None) -> str:
    """Requests running / waiting, as the server reports them ("—" for what it does not say)."""
    if s is None or (s.requests_running is None and s.requests_waiting is None):
        return "—"
    return f"{fmt.num(s.requests_running, '.0f')}/{fmt.num(s.requests_waiting, '.0f')}"


def _sleep_times(events: Any) -> str:
    """The latest timed sleep and wake of each server (from server.sleep / server.wake events)."""
    last: dict[tuple[str, str], Any] = {}
    for e in events:
        if e.kind in ("server.sleep", "server.wake") and e.ok and isinstance(e.new, dict):
            last[(e.target, e.kind)] = e
    verb = {"server.sleep": "slept in", "server.wake": "woke in"}
    parts = [f"{server} {verb[kind]} {e.new.get('seconds', 0):.2f} s" for (server, kind), e in sorted(last.items())]
    return ("sleep/wake: " + ", ".join(parts)) if parts else ""
