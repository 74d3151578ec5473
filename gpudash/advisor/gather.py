"""Gathering `DoctorFacts` for a real box or a sim rig: topology under a short engine load, CPU
placement, configured servers and the llama.cpp build. Anything that cannot be read is recorded with
the reason, so the matching check says `skip` instead of guessing."""

from __future__ import annotations

from typing import Any

from gpudash.advisor.facts import CpuPlacement, DoctorFacts, LinkLoad, cpu_placement, sim_cpu_placement
from gpudash.advisor.linkload import links_under_load
from gpudash.advisor.llama_build import LlamaBuild, read_llama_build
from gpudash.advisor.recorded import recorded_probe
from gpudash.config import Config, ServerSpec
from gpudash.telemetry.topology import TopologyFacts, read_topology


def llama_build_for(config: Config) -> tuple[LlamaBuild | None, str]:
    """The llama-server the config's first llama.cpp server (or a default one) would run, and why not."""
    from gpudash.launcher.binary import resolve_binary
    from gpudash.launcher.errors import LaunchError

    spec = next((s for s in config.servers if s.kind == "llama.cpp"),
                ServerSpec(name="llama-server", kind="llama.cpp", model="-"))
    try:
        return read_llama_build(resolve_binary(spec)), ""
    except LaunchError as err:
        return None, err.cause
    except OSError as err:
        return None, f"cannot read the llama-server binary: {err}"


def _engine_for(source_label: str, config: Config) -> Any:
    """A transfer engine with the config's knobs: the sim backend on a sim rig, else CUDA."""
    from gpudash.telemetry.factory import sim_engine

    if source_label.startswith("sim:"):
        return sim_engine(source_label.removeprefix("sim:"), config)
    from engine import EngineConfig, TransferEngine

    return TransferEngine(EngineConfig(**config.engine.model_dump(), backend="cuda"))


def busy_topology(source_label: str, config: Config, *, sim: Any = None, engine: Any = None,
                  load_s: float = 0.4) -> tuple[TopologyFacts, tuple[LinkLoad, ...] | None, str]:
    """The topology read while the engine copies to every GPU, with each link's GB/s; on failure the
    idle topology, None and the reason. `sim` is a live SimRigSource (its degraded links show)."""
    owned = engine is None and sim is None
    rig = sim

    def read() -> TopologyFacts:
        return read_topology(source_label, rig) if rig is not None else read_topology(source_label)

    try:
        eng = sim.engine if sim is not None else engine if engine is not None else _engine_for(source_label, config)
    except Exception as err:  # no native engine / no CUDA: the other checks still run
        return read(), None, f"the transfer engine could not start ({err})"
    try:
        if rig is None and source_label.startswith("sim:"):
            from gpudash.telemetry.sim import SimRigSource

            rig = SimRigSource(source_label.removeprefix("sim:"), eng)
        topo, loads = links_under_load(eng, [g.index for g in read().gpus], read, seconds=load_s)
        return topo, loads, ""
    except Exception as err:  # a refused copy or allocation: report it, keep the idle facts
        return read_topology(source_label), None, f"the engine load failed ({err})"
    finally:
        if owned:
            eng.close()


def gather(source_label: str, config: Config, *, sim: Any = None, engine: Any = None, load_s: float = 0.4,
           cpu: CpuPlacement | None = None) -> DoctorFacts:
    """Every fact the doctor checks need."""
    topo, loads, note = busy_topology(source_label, config, sim=sim, engine=engine, load_s=load_s)
    if cpu is None:
        cpu = sim_cpu_placement(topo) if topo.is_sim else cpu_placement()
    llama, llama_note = llama_build_for(config)
    requests, restores, requests_note = recorded_probe(config.store.resolved_path())
    return DoctorFacts(topology=topo, cpu=cpu, servers=tuple(config.servers), busy=loads, busy_note=note,
                       llama=llama, llama_note=llama_note, requests=requests, cache_restores=restores,
                       requests_note=requests_note)
