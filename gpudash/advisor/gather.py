"""Gathering `DoctorFacts` for a real box or a sim rig: topology under a short engine load, CPU
placement, configured servers and the llama.cpp build. Anything that cannot be read is recorded with
the reason, so the matching check says `skip` instead of guessing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpudash.advisor.facts import (CpuPlacement, DoctorFacts, LinkLoad, ServerLlama, cpu_placement,
                                   sim_cpu_placement)
from gpudash.advisor.linkload import links_under_load
from gpudash.launcher.llama.build_info import read_llama_build
from gpudash.advisor.recorded import recorded_probe
from gpudash.config import Config, ServerSpec
from gpudash.telemetry.rig import Rig, rig_of
from gpudash.telemetry.topology import TopologyFacts


def llama_builds_for(config: Config) -> tuple[ServerLlama, ...]:
    """The llama-server each llama.cpp server would run (the demo's when none is configured)."""
    from gpudash.config.servers import DEMO_NAME
    from gpudash.config import LlamaCppSpec

    return llama_builds_of(config.servers or [LlamaCppSpec(name=DEMO_NAME, model="-")])


def llama_builds_of(specs: Iterable[ServerSpec], with_version: bool = True) -> tuple[ServerLlama, ...]:
    """The llama-server each launched llama.cpp server of `specs` would run; `with_version=False` reads the
    build's files only (no `--version` run, which starts the GPUs of a CUDA build)."""
    from gpudash.launcher.binary import binary_origin, resolve_binary
    from gpudash.launcher.errors import LaunchError
    from gpudash.launcher.kinds import kind_of

    out = []
    for spec in (s for s in specs if not s.attached and kind_of(s).runs_llama_build):
        try:
            binary = resolve_binary(spec)
            out.append(ServerLlama(spec.name, read_llama_build(binary, with_version), binary_origin(spec, binary)))
        except LaunchError as err:
            out.append(ServerLlama(spec.name, None, err.cause))
        except OSError as err:
            out.append(ServerLlama(spec.name, None, f"cannot read the llama-server binary: {err}"))
    return tuple(out)


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
    builds = llama_builds_for(config)
    first = builds[0] if builds else None
    requests, restores, requests_note = recorded_probe(config.store.resolved_path())
    return DoctorFacts(topology=topo, cpu=cpu, servers=tuple(config.servers), busy=loads, busy_note=note,
                       llama=first.build if first else None,
                       llama_note="" if first is None or first.build else first.origin, llama_servers=builds,
                       requests=requests, cache_restores=restores, requests_note=requests_note)
