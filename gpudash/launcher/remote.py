"""A server that runs outside this process (under another gpudash, systemd, anything), reached over HTTP at
its address for one action: the target `gpudash server sleep|wake` hands the controller, in the place of
the supervisor. It checks a sleep or wake as the supervisor does (its kind's `sleep_problem`), times it,
and reports it as the supervisor does: a `server.sleep` / `server.wake` event with the seconds it took."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpudash.config import ServerSpec
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.sleep import Action, SleepError, SleepResult
from gpudash.launcher.supervisor import Pushable
from gpudash.records import Event


@dataclass(frozen=True)
class RemoteState:
    server: str
    state: str | None  # what the server said after the action ("sleeping", "awake"); None before or unknown


class RemoteServer:
    """One server at `base_url`; only sleep and wake act on it (the others are refused: it runs elsewhere)."""

    def __init__(self, spec: ServerSpec, base_url: str, inbox: Pushable) -> None:
        self.spec, self.base_url, self._inbox = spec, base_url.rstrip("/"), inbox
        self.result: SleepResult | None = None  # the last action's, once the server was asked
        self.asked = False  # whether the server was asked at all (a refusal before it asks nothing)
        self._state: str | None = None

    def specs(self) -> Mapping[str, ServerSpec]:
        return {self.spec.name: self.spec}

    def states(self) -> list[RemoteState]:
        return [RemoteState(self.spec.name, self._state)]

    def refusal(self, name: str, action: str) -> str | None:
        return None

    def pids(self) -> dict[int, str]:
        return {}

    def sleep(self, name: str, level: int = 1) -> SleepResult:
        return self._act("sleep", level)

    def wake(self, name: str) -> SleepResult:
        return self._act("wake", 1)

    def _act(self, action: Action, level: int) -> SleepResult:
        kind = kind_of(self.spec)
        problem = kind.sleep_problem(self.spec, level if action == "sleep" else None)
        if problem:
            raise LaunchError(self.spec.name, problem)
        self.asked = True
        try:
            res = kind.sleep(self.base_url, level) if action == "sleep" else kind.wake(self.base_url)
        except SleepError as err:
            self._event(action, ok=False, reason=str(err))
            raise LaunchError(self.spec.name, str(err)) from None
        self.result = res
        self._state = {True: "sleeping", False: "awake", None: "unknown"}[res.sleeping]
        self._event(action, new={"state": self._state, "seconds": round(res.seconds, 4), "level": res.level})
        return res

    def _event(self, action: Action, **fields: object) -> None:
        self._inbox.push(Event(ts=time.time(), actor="cli", kind=f"server.{action}", target=self.spec.name,
                               **fields))  # type: ignore[arg-type]

    def _refuse(self, *_: object) -> None:
        raise LaunchError(self.spec.name, "it runs outside this gpudash; start, stop and restart it where it runs")

    start = stop = restart = attach = _refuse  # type: ignore[assignment]
