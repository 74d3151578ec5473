"""The staging thresholds (h2d_staging_bytes, d2h_staging_bytes): Python-side knobs that validate like the
others, change live, travel from the [engine] config to the engine, and that autotune finds on cuda
(one-shot copies staged vs one driver copy) and leaves alone on the sim."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.autotune import SIM_STAGING_NOTE, STAGING_SIZES, staging_thresholds, tune, TuneResult
from gpudash.engine.config import KNOB, KNOBS
from gpudash.engine.errors import EngineArgumentError
from gpudash.config import Config, ConfigError, EngineSettings, validate
from gpudash.runtime.tuned import save_tuned

MiB = 2**20
STAGING = ("h2d_staging_bytes", "d2h_staging_bytes")
LIMIT = re.escape("[0, 1125899906842624]")


def test_defaults_and_limits() -> None:
    cfg = EngineConfig()
    assert (cfg.h2d_staging_bytes, cfg.d2h_staging_bytes) == (1 * MiB, 2 * MiB)
    assert {k: (KNOB[k].low, KNOB[k].high) for k in STAGING} == {k: (0, 2**50) for k in STAGING}
    assert cfg.knobs()["h2d_staging_bytes"] == 1 * MiB and cfg.knobs()["d2h_staging_bytes"] == 2 * MiB
    # the fields sit after the fallback knobs
    order = list(cfg.knobs())
    assert order.index("d2h_fallback_bytes") < order.index("h2d_staging_bytes") < order.index("d2h_staging_bytes")


def test_config_and_engine_know_the_same_knobs_with_the_same_defaults() -> None:
    """gpudash's [engine] section is what reaches EngineConfig (and the Controller's knob names)."""
    assert set(EngineSettings.model_fields) == set(KNOBS)
    assert EngineSettings().model_dump() == EngineConfig().knobs()


@pytest.mark.parametrize("knob", STAGING)
@pytest.mark.parametrize("value, message", [
    (-1, r"knob {k}=-1 is out of range; it must be in {lim}"),
    (2**50 + 1, r"knob {k}=1125899906842625 is out of range; it must be in {lim}"),
    ("4MiB", r"knob {k} must be an integer in {lim}, got '4MiB'"),
    (True, r"knob {k} must be an integer in {lim}, got True"),
    (1.5, r"knob {k} must be an integer in {lim}, got 1.5"),
    (None, r"knob {k} must be an integer in {lim}, got None"),
])
def test_bad_values_name_the_knob_and_its_limits_and_change_nothing(make_engine, knob: str, value: Any,
                                                                    message: str) -> None:
    eng = make_engine("h200")
    before = eng.knobs()
    pattern = message.format(k=knob, lim=LIMIT)
    with pytest.raises(EngineArgumentError, match=pattern):
        eng.set(**{knob: value, "outstanding": 5})  # the valid knob next to it must not land either
    assert eng.knobs() == before
    with pytest.raises(EngineArgumentError, match=pattern):
        EngineConfig(**{knob: value})


def test_set_round_trips_through_knobs_and_stats(make_engine) -> None:
    eng = make_engine("h200")
    before = eng.knobs()
    assert before["h2d_staging_bytes"] == 1 * MiB and before["d2h_staging_bytes"] == 2 * MiB
    out = eng.set(h2d_staging_bytes=0, d2h_staging_bytes=2**50)  # both limits are allowed
    assert out["h2d_staging_bytes"] == 0 and out["d2h_staging_bytes"] == 2**50
    assert eng.knobs() == {**before, "h2d_staging_bytes": 0, "d2h_staging_bytes": 2**50}
    assert eng.stats().knobs["d2h_staging_bytes"] == 2**50
    eng.set(h2d_staging_bytes=8 * MiB)
    assert eng.knobs()["h2d_staging_bytes"] == 8 * MiB and eng.knobs()["d2h_staging_bytes"] == 2**50


def test_engine_built_from_config_carries_them(tmp_path: Path) -> None:
    cfg = validate({"engine": {"h2d_staging_bytes": "32MiB", "d2h_staging_bytes": 0}})
    assert (cfg.engine.h2d_staging_bytes, cfg.engine.d2h_staging_bytes) == (32 * MiB, 0)
    with TransferEngine(EngineConfig(**cfg.engine.model_dump(), backend="sim", profile="h200")) as eng:
        assert eng.knobs()["h2d_staging_bytes"] == 32 * MiB and eng.knobs()["d2h_staging_bytes"] == 0
    assert Config().engine.h2d_staging_bytes == 1 * MiB and Config().engine.d2h_staging_bytes == 2 * MiB


@pytest.mark.parametrize("value, message", [
    (2**51, "staging threshold must be between 0 (always stage) and 2**50 bytes, got 2251799813685248 bytes"),
    (-1, "expected a size >= 0, got -1"),
    ("lots", "expected a size like '2.81MB', '4MiB' or 1048576, got 'lots'"),
    (True, "expected a size in bytes or a string like '4MiB', got a boolean"),
])
@pytest.mark.parametrize("knob", STAGING)
def test_config_refuses_bad_values_in_one_line(knob: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate({"engine": {knob: value}}, "c.toml")
    assert err.value.problems == [f"c.toml: engine.{knob}: {message}"]


def test_tuned_staging_knobs_are_stored_for_the_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = save_tuned({"outstanding": 3}, "box")
    save_tuned({"h2d_staging_bytes": 32 * MiB, "d2h_staging_bytes": 2**50}, "box")
    assert tomllib.loads(path.read_text())["engine"] == {"outstanding": 3, "h2d_staging_bytes": 32 * MiB,
                                                         "d2h_staging_bytes": 2**50}
    with pytest.raises(ConfigError, match="engine.d2h_staging_bytes: staging threshold must be between"):
        save_tuned({"d2h_staging_bytes": 2**51}, "box")
    assert tomllib.loads(path.read_text())["engine"]["d2h_staging_bytes"] == 2**50  # bad result never written


def test_autotune_on_the_sim_leaves_the_staging_thresholds_with_a_note() -> None:
    with TransferEngine(EngineConfig(backend="sim", profile="h200", sim_time_scale=30.0,
                                     h2d_staging_bytes=3 * MiB, d2h_staging_bytes=5 * MiB)) as eng:
        before = eng.knobs()
        res = tune(eng, size=4 * MiB)
        assert eng.knobs() == before
    assert not set(res.knobs) & set(STAGING)
    assert SIM_STAGING_NOTE in res.notes
    assert SIM_STAGING_NOTE == "the sim does not model the pageable-memory penalty; *_staging_bytes unchanged"
    assert not any("staged/driver" in what for what, _v, _r in res.table)


# ---- the cuda sweep, driven through a stand-in engine whose clock follows a cost model ----------------

class _Handle:
    def wait(self) -> None:
        pass


class _ModelEngine:
    """Copies advance a clock: the driver copy costs `driver(n, h2d)` seconds, staging `stage(n, h2d)`.
    Every copy is logged as (direction, mode, n, host buffer) so the test can see what tune timed."""

    def __init__(self, stage: Any, driver: Any, keep: bool = False) -> None:
        self.cost = {"stage": stage, "driver": driver}
        self.t = 0.0
        self.keep = keep  # keep the host buffers (small sweeps only): to check each copy got its own
        self.log: list[tuple[str, str, int, np.ndarray | None]] = []

    def copy(self, dst: Any, src: Any, n: int, pageable: str) -> _Handle:
        h2d = isinstance(src, np.ndarray)
        host = src if h2d else dst
        assert host.nbytes == n
        self.log.append(("h2d" if h2d else "d2h", pageable, n, host if self.keep else None))
        self.t += self.cost[pageable](n, h2d)
        return _Handle()


class _ModelSide:
    def __init__(self, eng: _ModelEngine) -> None:
        self.eng = eng

    def clock(self) -> float:
        return self.eng.t


def _sweep(stage: Any, driver: Any, size: int = 256 * MiB, reps: int = 3,
           keep: bool = False) -> tuple[TuneResult, _ModelEngine]:
    eng = _ModelEngine(stage, driver, keep)
    res = TuneResult()
    staging_thresholds(eng, _ModelSide(eng), object(), size, res, reps=reps)  # type: ignore[arg-type]
    return res, eng


def test_threshold_is_where_staging_wins_from_then_on() -> None:
    # driver: 10 GB/s H2D, 20 GB/s D2H; staging: 25 GB/s plus a fixed cost, so it wins from some size on.
    def driver(n: int, h2d: bool) -> float:
        return n / (10e9 if h2d else 20e9)

    def stage(n: int, h2d: bool) -> float:
        return n / 25e9 + (0.0025 if h2d else 0.0004)

    res, eng = _sweep(stage, driver)
    # h2d: staging wins where n*(1/10e9-1/25e9) >= 2.5 ms, n >= 41.7 MB -> 64 MiB is the only winning size.
    # d2h: n*(1/20e9-1/25e9) >= 0.4 ms -> n >= 40 MB -> also 64 MiB.
    assert res.knobs == {"h2d_staging_bytes": 64 * MiB, "d2h_staging_bytes": 64 * MiB}
    rows = {(what, int(v)): r for what, v, r in res.table}
    assert set(rows) == {(f"{d} staged/driver", n) for d in ("h2d", "d2h") for n in STAGING_SIZES}
    assert rows[("h2d staged/driver", 64 * MiB)] == pytest.approx(driver(64 * MiB, True) / stage(64 * MiB, True))
    assert rows[("h2d staged/driver", MiB)] < 1 < rows[("h2d staged/driver", 64 * MiB)]

    res, _ = _sweep(lambda n, h2d: n / 25e9 + (0.0025 if h2d else 0.0), driver)
    assert res.knobs == {"h2d_staging_bytes": 64 * MiB, "d2h_staging_bytes": MiB}  # d2h: wins at every size


def test_a_win_followed_by_a_loss_does_not_count_and_never_winning_is_huge() -> None:
    def driver(n: int, h2d: bool) -> float:
        return n / 10e9

    def stage(n: int, h2d: bool) -> float:
        if not h2d:
            return n / 5e9  # D2H: staging always loses
        return n / 20e9 if n in (2 * MiB, 16 * MiB, 32 * MiB, 64 * MiB) else n / 5e9  # H2D: loses at 4, 8 MiB

    res, _ = _sweep(stage, driver)
    assert res.knobs == {"h2d_staging_bytes": 16 * MiB, "d2h_staging_bytes": 2**50}


def test_sizes_capped_at_the_tune_size_and_buffers_fresh_and_interleaved() -> None:
    res, eng = _sweep(lambda n, h2d: n / 20e9, lambda n, h2d: n / 10e9, size=4 * MiB, reps=3, keep=True)
    assert res.knobs == {"h2d_staging_bytes": MiB, "d2h_staging_bytes": MiB}
    assert {int(v) for _w, v, _r in res.table} == {MiB, 2 * MiB, 4 * MiB}
    for direction in ("h2d", "d2h"):
        copies = [c for c in eng.log if c[0] == direction]
        warmup, timed = copies[:2], copies[2:]
        assert [(m, n) for _d, m, n, _h in warmup] == [("stage", MiB), ("driver", MiB)]
        # per size: 3 reps of both modes, interleaved and alternating which goes first
        assert [(m, n) for _d, m, n, _h in timed] == [
            (m, n) for n in (MiB, 2 * MiB, 4 * MiB)
            for m in ("stage", "driver", "driver", "stage", "stage", "driver")]
        hosts = [h for *_x, h in copies]
        assert len({id(h) for h in hosts}) == len(hosts)  # all kept alive, so distinct ids: a new buffer each
        assert not any(np.shares_memory(a, b) for a, b in zip(hosts, hosts[1:]))
        assert all(h.dtype == np.uint8 and h.flags.owndata for h in hosts)
        if direction == "h2d":
            assert all((h == 5).all() for h in hosts)  # a filled source


def test_sizes_below_the_smallest_leave_the_thresholds_with_a_note() -> None:
    res, eng = _sweep(lambda n, h2d: 1.0, lambda n, h2d: 2.0, size=MiB // 2)
    assert res.knobs == {} and eng.log == [] and res.table == []
    assert any("*_staging_bytes unchanged" in n for n in res.notes)


def test_medians_decide_not_one_outlier() -> None:
    calls = {"n": 0}

    def stage(n: int, h2d: bool) -> float:  # one very slow staged rep per size must not flip the result
        calls["n"] += 1
        return 1.0 if calls["n"] % 5 == 3 else n / 20e9

    res, _ = _sweep(stage, lambda n, h2d: n / 10e9, size=2 * MiB, reps=5)
    assert res.knobs == {"h2d_staging_bytes": MiB, "d2h_staging_bytes": MiB}
