"""The knob table is the one source: the C header, the ctypes struct, EngineConfig, the [engine] settings,
control's knob names and the knob form all follow it, and a table row reaches each of them."""

from __future__ import annotations

import ctypes

import pytest

from gpudash.engine import _native as N
from gpudash.engine.config import KNOB, KNOB_TABLE, KNOBS, EngineConfig, c_layout, default_staging_threads
from gpudash.engine.config import KnobValueError, validate_knobs
from gpudash.engine.knob_header import ABI_HEADER, HEADER, render, render_abi
from gpudash.engine.transfer import TransferEngine
from gpudash.config import ConfigError, EngineSettings, parse_knobs, validate
from gpudash.runtime.control import ENGINE_KNOBS


def test_the_checked_in_header_is_the_one_the_table_writes() -> None:
    assert HEADER.read_text(encoding="utf-8") == render(), \
        "csrc/knob_limits.h differs from gpudash/engine/config.py's knob table; run `python -m gpudash.engine.knob_header`"


def test_the_abi_version_is_kept_in_one_place_and_the_library_reports_it() -> None:
    assert ABI_HEADER.read_text(encoding="utf-8") == render_abi(), \
        "csrc/abi_version.h differs from _native.ABI_VERSION; run `python -m gpudash.engine.knob_header`"
    assert f"#define GE_ABI_VERSION {N.ABI_VERSION}\n" in render_abi()
    spelled = [p.name for p in sorted(ABI_HEADER.parent.rglob("*.[ch]*")) if p != ABI_HEADER
               and "#define GE_ABI_VERSION" in p.read_text(encoding="utf-8")]
    assert spelled == []
    assert N.lib().ge_abi_version() == N.ABI_VERSION


def test_the_ctypes_struct_has_the_tables_layout() -> None:
    layout = c_layout()
    assert [(name, getattr(N.Knobs, name).offset) for name, _t, _o in layout] == [(n, o) for n, _t, o in layout]
    assert [n for n, _t, _o in layout][:4] == ["h2d_chunk_bytes", "d2h_chunk_bytes", "h2d_fallback_bytes",
                                               "d2h_fallback_bytes"]  # the C layout ge_knobs has always had
    assert ctypes.sizeof(N.Knobs) == 48 and N.Knobs.reserved.offset == 44
    assert {n for n, _t, _o in layout} - {"reserved"} == {k.name for k in KNOB_TABLE if k.native}


def test_the_struct_is_filled_by_name() -> None:
    knobs = {**EngineConfig().knobs(), "outstanding": 7, "direct_first": False, "d2h_fallback_bytes": 123}
    s = N.Knobs.of(knobs)
    assert (s.outstanding, s.direct_first, s.d2h_fallback_bytes, s.reserved) == (7, 0, 123, 0)


def test_every_consumer_names_the_table_knobs_with_the_table_defaults() -> None:
    assert tuple(EngineSettings.model_fields) == KNOBS == ENGINE_KNOBS
    assert EngineSettings().model_dump() == EngineConfig().knobs() == {k.name: k.default for k in KNOB_TABLE}
    assert all(EngineSettings.model_fields[k.name].description == k.doc for k in KNOB_TABLE)


def test_the_form_shows_the_live_knobs_only() -> None:
    from gpudash.tui.screens.forms import EDITABLE_KNOBS, SWITCH_KNOBS

    assert SWITCH_KNOBS == ("direct_first",)
    assert "registration_cache_bytes" not in EDITABLE_KNOBS and not KNOB["registration_cache_bytes"].live
    assert set(EDITABLE_KNOBS) | set(SWITCH_KNOBS) == {k.name for k in KNOB_TABLE if k.live}


@pytest.mark.parametrize("knob, value, message", [
    ("h2d_chunk_bytes", "1KiB", "chunk size must be between 4 KiB and 1 GiB, got 1024 bytes"),
    ("outstanding", 65, "outstanding must be between 1 and 64, got 65"),
    ("staging_threads", 0, "staging_threads must be between 1 and 64, got 0"),
    ("h2d_fallback_bytes", 2**51, "fallback threshold must be between 0 (always multipath) and 2**50 bytes, "
                                  "got 2251799813685248 bytes"),
])
def test_config_ranges_come_from_the_table(knob: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate({"engine": {knob: value}}, "c.toml")
    assert err.value.problems == [f"c.toml: engine.{knob}: {message}"]


def test_staging_threads_default_to_half_the_usable_cores_within_range() -> None:
    assert [default_staging_threads(c) for c in (1, 2, 3, 8, 16, 64, 256)] == [1, 1, 1, 4, 8, 16, 16]
    k = KNOB["staging_threads"]
    assert k.default == default_staging_threads() and k.low <= k.default <= k.high
    assert "sched_getaffinity" in k.doc


def _edges(k) -> list[object]:
    """Values at and just past a knob's limits, and values of the wrong type."""
    if k.is_bool:
        return [True, False, 0, 1, None, "yes"]
    return [k.low - 1, k.low, k.high, k.high + 1, True, 1.5, None, "4MiB"]


@pytest.mark.parametrize("k", KNOB_TABLE, ids=lambda k: k.name)
def test_every_entry_point_applies_the_one_rule(k) -> None:
    """Knob.check decides; the engine's validate_knobs, the [engine] settings and parse_knobs (the form,
    control, `run --knob`) each take a value of the knob's own type exactly when it does."""
    for value in _edges(k):
        try:
            k.check(value)
            ok = True
        except KnobValueError as err:
            ok = False
            assert err.reason and str(err).startswith(f"knob {k.name}")
        engine_ok = _accepts(lambda: validate_knobs({k.name: value}))
        assert engine_ok == ok, (k.name, value)
        # pydantic reads text and numbers loosely (a form's "3", a TOML 1): compare values of the knob's type
        typed = isinstance(value, bool) if k.is_bool else isinstance(value, int) and not isinstance(value, bool)
        if typed:
            assert _accepts(lambda: EngineSettings.model_validate({k.name: value})) == ok, (k.name, value)
            assert _accepts(lambda: parse_knobs({k.name: value})) == ok, (k.name, value)
            assert _accepts(lambda: parse_knobs({k.name: str(value).lower()})) == ok, (k.name, value)


def _accepts(fn) -> bool:
    try:
        fn()
    except ValueError:
        return False
    return True


def test_parse_knobs_reads_what_a_person_types_and_names_the_bad_knob() -> None:
    assert parse_knobs({"h2d_chunk_bytes": "4MiB", "outstanding": "3", "direct_first": "false"}) == {
        "h2d_chunk_bytes": 4 * 2**20, "outstanding": 3, "direct_first": False}
    with pytest.raises(ValueError, match=r"^outstanding: outstanding must be between 1 and 64, got 0$"):
        parse_knobs({"h2d_chunk_bytes": "4MiB", "outstanding": "0"})
    with pytest.raises(ValueError, match=r"^warp_speed: "):
        parse_knobs({"warp_speed": 9})


def test_the_native_check_has_the_tables_limits() -> None:
    """ge_set_knobs, called past the Python check, refuses a value just outside a native knob's range and
    takes its lowest (and, but for sizes that would grow the pools, its highest) value."""
    eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
    try:
        base = eng.knobs()
        for name, _ctype, _offset in c_layout():
            if name.startswith("reserved"):
                continue
            k = KNOB[name]
            outside = [k.high + 1] + ([k.low - 1] if k.low > 0 else [])
            inside = [k.low] + ([] if k.is_size else [k.high])
            for value, expect in [(v, N.EINVAL) for v in outside] + [(v, N.OK) for v in inside]:
                raw = N.Knobs.of({**base, name: value})
                assert N.call("ge_set_knobs", eng._ptr, ctypes.byref(raw)) == expect, (name, value)
                assert N.call("ge_set_knobs", eng._ptr, ctypes.byref(N.Knobs.of(base))) == N.OK
    finally:
        eng.close()
