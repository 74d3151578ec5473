"""Modal forms that build control commands; every field validates as you type (the same pydantic model
the config uses), and a form only closes with a command that passed validation."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.validation import ValidationResult, Validator
from textual.widgets import Checkbox, Input, Label, Static

from gpudash.engine.config import KNOB, KNOB_TABLE
from gpudash.config import ServerSpec, parse_knobs, parse_size
from gpudash.runtime.control import Command, SetEngineKnobs, SetShardSize, SetShare, SetSplit
from gpudash.launcher.shares import parse_share
from gpudash import fmt

# The live knobs of the knob table: numbers as inputs, switches as checkboxes.
EDITABLE_KNOBS = tuple(k.name for k in KNOB_TABLE if k.live and not k.is_bool)
SWITCH_KNOBS = tuple(k.name for k in KNOB_TABLE if k.live and k.is_bool)


class KnobValidator(Validator):
    """One engine knob checked by the knob table's rule (parse_knobs; sizes accept '4MiB', '2.81MB')."""

    def __init__(self, knob: str) -> None:
        super().__init__()
        self.knob = knob

    def validate(self, value: str) -> ValidationResult:
        try:
            parse_knobs({self.knob: value.strip()})
        except ValueError as err:
            return self.failure(str(err))
        return self.success()


def parse_ratios(text: str) -> tuple[float, ...]:
    """'2,3' or '2 3' -> (2.0, 3.0); ValueError with a sentence otherwise."""
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        ratios = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"ratios must be numbers separated by commas, like 2,3; got {text!r}") from None
    if not ratios or any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ValueError("ratios must be non-negative with a positive sum, like 2,3")
    return ratios


class FuncValidator(Validator):
    def __init__(self, check: Any) -> None:
        super().__init__()
        self.check = check

    def validate(self, value: str) -> ValidationResult:
        try:
            self.check(value)
        except ValueError as err:
            return self.failure(str(err))
        return self.success()


class FormInput(Input):
    """A form's text field that takes only keys typed after its form opened: keys still queued from before
    (typed for the dashboard while `t` was being handled) never land in it."""

    async def _on_key(self, event: events.Key) -> None:
        opened = getattr(self.screen, "opened_at", None)
        if opened is not None and event.time < opened:
            event.prevent_default()
            event.stop()
            return
        await super()._on_key(event)


class FormScreen(ModalScreen[Any]):
    """A form: Enter applies when every field is valid (dismissing with what `build` made), Esc cancels.
    Its title and its errors line are docked (app.tcss), so on a short terminal only the fields scroll,
    and Enter on a bad value brings that field into sight."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="form.cancel")]
    AUTO_FOCUS = "Input"
    opened_at: float | None = None  # the Mount event's time: keys older than it were meant for the dashboard

    def on_mount(self, event: events.Mount) -> None:
        self.opened_at = event.time

    def on_input_changed(self, event: Input.Changed) -> None:
        self._show_errors()

    def _show_errors(self) -> bool:
        msgs = []
        for inp in self.query(Input):
            res = inp.validate(inp.value)
            if res is not None and not res.is_valid:
                msgs.extend(res.failure_descriptions)
        self.query_one("#form-errors", Static).update(Text("\n".join(msgs) or "valid: Enter to apply"))
        self.query_one("#form-errors", Static).set_class(bool(msgs), "invalid")
        return not msgs

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self._show_errors():
            command = self.build()
            if command is not None:
                self.dismiss(command)
            return
        # The errors line stays in sight (docked under the fields); the first bad field comes into sight too
        bad = next((inp for inp in self.query(Input) if not getattr(inp.validate(inp.value), "is_valid", True)), None)
        if bad is not None:
            bad.focus()
            bad.scroll_visible(animate=False)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def build(self) -> Any:
        raise NotImplementedError


class KnobForm(FormScreen):
    """The engine's live knobs (the knob table's rows marked live): chunk sizes, queue length, fallback
    and staging thresholds, staging threads, direct-first."""

    def __init__(self, knobs: dict[str, Any]) -> None:
        super().__init__(id="knob-form")
        self.knobs = knobs

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            yield Label("Engine knobs (sizes take 4MiB, 2.81MB or bytes). Enter: apply, Esc: cancel",
                        classes="form-title")
            for k in EDITABLE_KNOBS:
                yield Label(Text.assemble((k, "bold"), f": {KNOB[k].doc}"))
                yield FormInput(fmt.knob(self.knobs.get(k, "")), id=f"knob-{k}", validators=[KnobValidator(k)],
                            validate_on=["changed", "submitted"])
            for k in SWITCH_KNOBS:
                yield Checkbox(k, bool(self.knobs.get(k, KNOB[k].default)), id=f"knob-{k}")
            yield Static("", id="form-errors")

    def build(self) -> Command | None:
        changed: dict[str, Any] = {}
        for k in EDITABLE_KNOBS:
            value = parse_knobs({k: self.query_one(f"#knob-{k}", Input).value.strip()})[k]
            if value != self.knobs.get(k):
                changed[k] = value
        for k in SWITCH_KNOBS:
            on = self.query_one(f"#knob-{k}", Checkbox).value
            if on != self.knobs.get(k):
                changed[k] = on
        if not changed:
            self.query_one("#form-errors", Static).update("nothing changed; edit a value or press Esc")
            return None
        return SetEngineKnobs(changed)


class SplitForm(FormScreen):
    """The selected llama.cpp server's tensor split ratios (-ts): one ratio per GPU it runs on."""

    def __init__(self, spec: ServerSpec, gpus: list[int]) -> None:
        super().__init__(id="split-form")
        self.spec, self.gpus = spec, gpus

    def _check(self, text: str) -> None:
        problem = self.spec.split_problem(parse_ratios(text), self.gpus)
        if problem:
            raise ValueError(problem)

    def compose(self) -> ComposeResult:
        current = ",".join(f"{r:g}" for r in (self.spec.split_ratios() or [1.0] * max(1, len(self.gpus))))
        with Vertical(classes="form"):
            yield Label(Text(f"Split ratios for {self.spec.name} on GPUs {','.join(map(str, self.gpus))} "
                             "(re-launches it). Enter: apply, Esc: cancel"), classes="form-title")
            yield FormInput(current, id="split-ratios", validators=[FuncValidator(self._check)],
                        validate_on=["changed", "submitted"])
            yield Static("", id="form-errors")

    def build(self) -> Command | None:
        return SetSplit(self.spec.name, parse_ratios(self.query_one("#split-ratios", Input).value))


class ShareForm(FormScreen):
    """The selected server's memory share of each of its GPUs."""

    def __init__(self, spec: ServerSpec) -> None:
        super().__init__(id="share-form")
        self.spec = spec

    def compose(self) -> ComposeResult:
        with Vertical(classes="form"):
            now = "none set: it may use all of its GPUs' memory" if self.spec.share is None \
                else f"now {self.spec.share:g}"
            yield Label(Text(f"Memory share for {self.spec.name}, 0-1 of each of its GPUs ({now}; re-launches "
                             "it). Enter: apply, Esc: cancel"), classes="form-title")
            yield FormInput(f"{1.0 if self.spec.share is None else self.spec.share:g}", id="share-value",
                        validators=[FuncValidator(parse_share)], validate_on=["changed", "submitted"])
            yield Static("", id="form-errors")

    def build(self) -> Command | None:
        share = parse_share(self.query_one("#share-value", Input).value)
        if share == self.spec.share:
            self.query_one("#form-errors", Static).update(Text(f"{self.spec.name} already has share {share:g}; "
                                                               "edit it or press Esc"))
            return None
        return SetShare(self.spec.name, share)


class ShardForm(FormScreen):
    """The selected pool shard's capacity (live resize; the pool refuses what live allocations forbid)."""

    def __init__(self, pool: str, shard: str, capacity: int, unassigned: int | None = None, used: int = 0) -> None:
        """`unassigned`: the pool's slab that no shard owns, as last sampled (None where unknown); `used`:
        what the shard's live allocations hold (it cannot shrink below that)."""
        super().__init__(id="shard-form")
        self.pool, self.shard, self.capacity, self.unassigned, self.used = pool, shard, capacity, unassigned, used

    @property
    def largest(self) -> int | None:
        return None if self.unassigned is None else self.capacity + self.unassigned

    def _check(self, text: str) -> None:
        """A size the pool can take: no less than what is in use, no more than the shard plus the free slab."""
        size = parse_size(text)
        if size < self.used:
            raise ValueError(f"{self.shard} holds {fmt.exact_size(self.used)} in live allocations: give at least that")
        if self.largest is not None and size > self.largest:
            raise ValueError(f"at most {fmt.exact_size(self.largest)}: its size plus the slab no shard owns")

    def compose(self) -> ComposeResult:
        room = "" if self.unassigned is None else (
            f"; it can grow to {fmt.size(self.largest)} ({fmt.size(self.unassigned)} of the slab is unassigned)")
        takes = f"from {fmt.exact_size(self.used)} to {fmt.exact_size(self.largest)}" if self.largest is not None \
            else f"at least {fmt.exact_size(self.used)}"
        with Vertical(classes="form"):
            yield Label(Text(f"Capacity of shard {self.shard} in pool {self.pool}, now {fmt.size(self.capacity)}{room}. "
                             f"Type a size {takes}, like {fmt.exact_size(self.capacity)}, or bytes. "
                             "Enter: apply, Esc: cancel"), classes="form-title")
            yield FormInput(fmt.exact_size(self.capacity), id="shard-capacity", validators=[FuncValidator(self._check)],
                        validate_on=["changed", "submitted"])
            yield Static("", id="form-errors")

    def build(self) -> Command | None:
        # the field's validator checked the size; the command keeps the words typed ("24MiB") for the toast
        return SetShardSize(self.pool, self.shard, self.query_one("#shard-capacity", Input).value.strip())
