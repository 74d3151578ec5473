"""Gathering `DoctorFacts` for a real box or a sim rig: topology under a short engine load, CPU
placement, configured servers and the llama.cpp build. Anything that cannot be read is recorded with
the reason, so the matching check says `skip` instead of guessing."""

from __future__ import annotations

from typing import Any

from gpudash.advisor.facts import CpuPlacement, DoctorFacts, LinkLoad, cpu_placement, sim_cpu_placement
from gpudash.advisor.linkload import links_under_load
from gpudash.advisor.llama_build import LlamaBuild, read_llama_build
from gpudash.config import Config, ServerSpec
from gpudash.rig import Rig, rig_of
from gpudash.telemetry.topology import TopologyFacts


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


def busy_topology(rig: Rig | str, config: Config, *, sim: Any = None, engine: Any = None,
                  load_s: float = 0.4) -> tuple[TopologyFacts, tuple[LinkLoad, ...] | None, str]:
    """The topology read while the engine copies to every GPU, with each link's GB/s; on failure the
    idle topology, None and the reason. `sim` is a live SimRigSource (its degraded links show)."""
    rig = rig_of(rig)
    owned = engine is None and sim is None
    live = sim

    def read() -> TopologyFacts:
        return rig.topology(live)

    try:
        eng = sim.engine if sim is not None else engine if engine is not None else rig.make_engine(config)
    except Exception as err:  # no native engine / no CUDA: the other checks still run
        return read(), None, f"the transfer engine could not start ({err})"
    try:
        if live is None and rig.is_sim:  # the sim rig's links as the engine's load degrades them
            from gpudash.telemetry.sim import SimRigSource

            live = SimRigSource(rig.profile or "", eng)
        topo, loads = links_under_load(eng, [g.index for g in read().gpus], read, seconds=load_s)
        return topo, loads, ""
    except Exception as err:  # a refused copy or allocation: report it, keep the idle facts
        return rig.topology(), None, f"the engine load failed ({err})"
    finally:
        if owned:
            eng.close()


def gather(rig: Rig | str, config: Config, *, sim: Any = None, engine: Any = None, load_s: float = 0.4,
           cpu: CpuPlacement | None = None) -> DoctorFacts:
    """Every fact the doctor checks need, for a rig (or its label)."""
    topo, loads, note = busy_topology(rig, config, sim=sim, engine=engine, load_s=load_s)
    if cpu is None:
        cpu = sim_cpu_placement(topo) if topo.is_sim else cpu_placement()
    llama, llama_note = llama_build_for(config)
    return DoctorFacts(topology=topo, cpu=cpu, servers=tuple(config.servers), busy=loads, busy_note=note,
                       llama=llama, llama_note=llama_note)
