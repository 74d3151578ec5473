"""Gathering `DoctorFacts` for a real box or a sim rig: topology under a short engine load, CPU
placement, configured servers and the llama.cpp build. Anything that cannot be read is recorded with
the reason, so the matching check says `skip` instead of guessing."""

from __future__ import annotations

from typing import Any

from gpudash.advisor.facts import (CpuPlacement, DoctorFacts, LinkLoad, ServerLlama, cpu_placement,
                                   sim_cpu_placement)
from gpudash.advisor.linkload import links_under_load
from gpudash.advisor.llama_build import read_llama_build
from gpudash.config import Config, ServerSpec
from gpudash.telemetry.topology import TopologyFacts, read_topology


def llama_builds_for(config: Config) -> tuple[ServerLlama, ...]:
    """The llama-server each llama.cpp server would run (the demo's when none is configured)."""
    from gpudash.launcher.binary import binary_origin, resolve_binary
    from gpudash.launcher.demo import DEMO_NAME
    from gpudash.launcher.errors import LaunchError

    specs = [s for s in config.servers if s.kind == "llama.cpp"] if config.servers else \
        [ServerSpec(name=DEMO_NAME, kind="llama.cpp", model="-")]
    out = []
    for spec in specs:
        try:
            binary = resolve_binary(spec)
            out.append(ServerLlama(spec.name, read_llama_build(binary), binary_origin(spec, binary)))
        except LaunchError as err:
            out.append(ServerLlama(spec.name, None, err.cause))
        except OSError as err:
            out.append(ServerLlama(spec.name, None, f"cannot read the llama-server binary: {err}"))
    return tuple(out)


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
    builds = llama_builds_for(config)
    first = builds[0] if builds else None
    return DoctorFacts(topology=topo, cpu=cpu, servers=tuple(config.servers), busy=loads, busy_note=note,
                       llama=first.build if first else None,
                       llama_note="" if first is None or first.build else first.origin, llama_servers=builds)
