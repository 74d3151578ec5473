"""J/token of a real llama-server on the sim rig, end to end: `gpudash serve --sim h200` runs it, a known
workload (requests of a fixed number of generated tokens) goes to it, and the recorded J/token is the rig's
energy over the counted window divided by the tokens the server said it generated, within 5%."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "cli"))
from cli_helpers import env, free_ports  # noqa: E402
from launcher_helpers import query  # noqa: E402

REQUESTS, PREDICT = 16, 64  # about 2 s of generation on 2 cores: several ticks


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "serve exited"
        try:
            if httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the llama-server never answered /health")


@pytest.mark.llama
def test_recorded_joules_per_token_is_the_rigs_energy_over_the_servers_tokens(tmp_path: Path, tiny_model: Path,
                                                                              llama_server: str) -> None:
    (port,) = free_ports(1)
    cfg = tmp_path / "gpudash.toml"
    cfg.write_text(f'[probe]\nenabled = false\n\n[sampling]\ninterval_s = 0.25\n\n'
                   f'[[servers]]\nname = "tiny"\nmodel = "{tiny_model}"\nbinary = "{llama_server}"\n'
                   f'ctx_size = 512\nport = {port}\n')
    db = tmp_path / "serve.db"
    proc = subprocess.Popen([sys.executable, "-c", "from gpudash.cli import main; main()", "serve", "--config",
                             str(cfg), "--db", str(db), "--sim", "h200", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(tmp_path),
                            cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    generated = 0
    try:
        _wait_health(url, proc)
        time.sleep(1.5)  # idle ticks: counting begins with the server on its GPU
        with httpx.Client(trust_env=False, timeout=60) as client:
            for i in range(REQUESTS):
                r = client.post(f"{url}/completion", json={"prompt": f"request {i}: tell me", "n_predict": PREDICT,
                                                           "ignore_eos": True, "cache_prompt": False})
                r.raise_for_status()
                generated += int(r.json()["tokens_predicted"])
        time.sleep(1.5)  # ticks that see the last request's tokens
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert generated == REQUESTS * PREDICT
    (sid,) = query(db, "select id from sessions where source = 'sim:h200'")[0]
    rows = query(db, f"select tick, busy_j, idle_j, generation_tokens, split, gpus from server_energy_samples "
                      f"where session_id = {sid} and server = 'tiny' order by tick")
    assert rows, "no energy was counted for the server"
    first_tick, last = rows[0][0], rows[-1]
    _, busy, idle, tokens, split, gpus = last
    assert (split, gpus) == ("whole_gpu", "0") and busy > 0 and idle > 0
    # the rig's energy over the ticks counted: from the tick before the first row (counting starts there)
    (e0,), (e1,) = (query(db, f"select energy_j from gpu_samples where session_id = {sid} and tick = {t} and "
                               f"\"index\" = 0") [0] for t in (first_tick - 1, last[0]))
    rig_j = e1 - e0
    assert busy + idle == pytest.approx(rig_j, rel=1e-6)
    recorded = (busy + idle) / tokens
    truth = rig_j / generated
    print(f"recorded {recorded:.3f} J/token over {tokens:.1f} counted tokens; rig {truth:.3f} J/token over {generated}")
    assert recorded == pytest.approx(truth, rel=0.05), (recorded, truth, tokens, generated)
    # `gpudash history` says the session's J/token, the recorded one
    shown = subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", "history", "--db", str(db),
                            "--json"], capture_output=True, text=True, env=env(tmp_path), cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    (session,) = [s for s in json.loads(shown.stdout)["sessions"] if s["id"] == sid]
    (tiny,) = session["energy"]
    assert tiny["server"] == "tiny" and tiny["j_per_token"] == pytest.approx(recorded)
    table = subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main()", "history", "--db", str(db)],
                           capture_output=True, text=True, env={**env(tmp_path), "COLUMNS": "200"}, cwd=tmp_path,
                           timeout=60)
    assert f"tiny {recorded:.3g} J" in table.stdout, table.stdout
