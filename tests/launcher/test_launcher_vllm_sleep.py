"""vLLM sleep mode against the vLLM test double: the supervisor, the control command and `gpudash server
sleep|wake` put a server to sleep and wake it, time it, and record it as an event with its duration."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.runtime.control import Controller, ServerAction
from gpudash.launcher.binary import binary_flags, parse_help
from gpudash.launcher.kinds import KINDS
from gpudash.launcher.errors import LaunchError
from gpudash.telemetry.servers import ServerSource
from gpudash.launcher.sleep import is_sleeping
from launcher_helpers import Events

SAMPLE_HELP = Path(__file__).parent / "samples" / "vllm-0.33.0-serve-help-all.txt"


def vspec(**kw) -> ServerSpec:
    kw.setdefault("extra_args", ["--load-delay", "0", "--wake-delay", "0.2"])
    return ServerSpec(name="v", kind="vllm", model="org/model", **kw)


def test_the_double_prints_the_flags_vllm_033_prints(fake_vllm) -> None:
    double = binary_flags(KINDS["vllm"], str(fake_vllm)).supported()
    real = parse_help(SAMPLE_HELP.read_text()).supported()
    launcher_uses = {"--host", "--port", "--gpu-memory-utilization", "--tensor-parallel-size", "-tp",
                     "--pipeline-parallel-size", "-pp", "--max-model-len", "--max-num-seqs", "--kv-offloading-size",
                     "--kv-offloading-backend", "--enforce-eager", "--enable-prefix-caching",
                     "--disable-prefix-caching", "--enable-sleep-mode", "--enable-prompt-tokens-details"}
    assert launcher_uses <= real and launcher_uses <= double
    assert "--no-enable-prefix-caching" not in real | double  # hidden by both


def test_sleep_and_wake_are_timed_events(fake_vllm, make_supervisor, events: Events) -> None:
    sup = make_supervisor([vspec(enable_sleep_mode=True)])
    sup.start_all()
    asleep = sup.sleep("v", level=1)
    assert asleep.sleeping is True and asleep.level == 1
    assert sup.states()[0].state == "sleeping" and sup.states()[0].pid is not None
    source = ServerSource(sup)
    try:
        (st,) = source.poll()["servers"]
        assert st.state == "sleeping"  # vllm:engine_sleep_state{sleep_state="awake"} is 0
        woke = sup.wake("v")
        (st,) = source.poll()["servers"]
    finally:
        source.close()
    assert st.state == "ready" and woke.sleeping is False
    assert woke.seconds >= 0.2  # the double's --wake-delay
    sleep_ev, wake_ev = [e for e in events.drain() if e.kind in ("server.sleep", "server.wake")]
    assert (sleep_ev.kind, sleep_ev.old, sleep_ev.new["state"], sleep_ev.new["level"]) == (
        "server.sleep", "ready", "sleeping", 1)
    assert wake_ev.new["seconds"] == pytest.approx(woke.seconds, abs=1e-3) and wake_ev.new["state"] == "ready"


def test_sleep_needs_sleep_mode_and_dev_mode(fake_vllm, make_supervisor, events: Events) -> None:
    plain, no_dev = vspec(), ServerSpec(name="n", kind="vllm", model="org/model", enable_sleep_mode=True,
                                        env={"VLLM_SERVER_DEV_MODE": "0"}, extra_args=["--load-delay", "0"])
    sup = make_supervisor([plain, no_dev])
    sup.start_all()
    with pytest.raises(LaunchError, match="enable_sleep_mode = true"):
        sup.sleep("v")
    with pytest.raises(LaunchError, match="does not serve /sleep: .*VLLM_SERVER_DEV_MODE=1"):
        sup.sleep("n")
    (ev,) = [e for e in events.drain() if e.kind == "server.sleep"]
    assert ev.target == "n" and not ev.ok and sup.states()[1].state == "ready"


def test_control_sleep_and_wake(fake_vllm, make_supervisor, events: Events) -> None:
    sup = make_supervisor([vspec(enable_sleep_mode=True)])
    sup.start_all()
    ctl = Controller(supervisor=sup, inbox=events.inbox)
    r = ctl.apply(ServerAction("v", "sleep"))
    assert r.ok and (r.event.old, r.event.new) == ("ready", "sleeping")
    r = ctl.apply(ServerAction("v", "wake"))
    assert r.ok and r.event.new == "ready"
    assert ctl.apply(ServerAction("v", "nap")).reason == ("unknown server action 'nap'; use start, stop, restart, "
                                                         "sleep or wake")


def test_cli_sleep_and_wake_record_their_duration(fake_vllm, make_supervisor, tmp_path: Path) -> None:
    from gpudash.launcher.health import free_port

    port = free_port()
    sup = make_supervisor([vspec(enable_sleep_mode=True, port=port)])
    sup.start_all()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "org/model"\nport = {port}\n'
                   'enable_sleep_mode = true\n')
    db = tmp_path / "g.db"

    def gpudash(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpudash", "--config", str(cfg), "server", *args,
                               "--db", str(db)], capture_output=True, text=True, timeout=60)

    out = gpudash("sleep", "v", "--level", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("v: asleep (level 2) after ") and "server says: sleeping" in out.stdout
    assert is_sleeping(sup.base_url("v")) is True
    out = gpudash("wake", "v")
    assert out.returncode == 0 and "v: awake after " in out.stdout
    rows = sqlite3.connect(db).execute("SELECT kind, actor, ok FROM events ORDER BY ts").fetchall()
    # through the controller, as from the keyboard: the timed event, then the request with its outcome
    assert rows == [("server.sleep", "cli", 1), ("server.sleep.request", "cli", 1),
                    ("server.wake", "cli", 1), ("server.wake.request", "cli", 1)]
    bad = gpudash("wake", "nope")
    assert bad.returncode == 2 and "no server named 'nope'" in bad.stderr


@pytest.mark.parametrize("extra", [(), ("--url", "http://127.0.0.1:9")])
def test_sleep_on_an_attached_llama_server_says_it_has_no_sleep_mode(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """Issue 45 item 8: an attached llama.cpp entry was told it has no fixed `port` (pass --url), and with
    --url that it is attached; neither said llama-server has no sleep mode. Nothing is contacted or recorded."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[servers]]\nname = "ext"\nkind = "llama.cpp"\nurl = "http://127.0.0.1:9"\n')
    db = tmp_path / "g.db"
    out = subprocess.run([sys.executable, "-m", "gpudash", "--config", str(cfg), "server", "sleep", "ext", *extra,
                          "--db", str(db)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "server 'ext' is llama-server, which has no sleep mode" in out.stderr
    assert "--url" not in out.stderr.replace("\n", " ").split("no sleep mode")[1] and not db.exists()
