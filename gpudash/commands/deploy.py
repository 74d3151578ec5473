"""`gpudash deploy prometheus|rules|grafana|systemd|runbook|kubernetes [--out DIR]`: the deployment files of this installed
version, so a pip or pipx user has them without the git tree.

The wheel carries deploy/ as `gpudash/deploy/` (CMakeLists.txt installs it); a source checkout reads the
repository's own deploy/. The systemd unit is written with ExecStart naming this installation's gpudash.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click

import gpudash
from gpudash.private_fs import read_capped, write_atomic

# target -> (folder under deploy/, file-name pattern): the rules and the dashboard are the files CI tests.
TARGETS: dict[str, tuple[str, str]] = {
    "prometheus": ("prometheus", "*.yml"),  # the example scrape config and the rules it loads
    "rules": ("prometheus", "*rules*.yml"),
    "grafana": ("grafana", "*.json"),
    "systemd": ("systemd", "*.service"),
    "runbook": (".", "RUNBOOK.md"),
    "kubernetes": ("kubernetes", "*.yaml"),  # DaemonSet, Service, ServiceMonitor; the rules as a PrometheusRule  # what each alert means and what to do; the rules' runbook_url points here
}
SHIPPED_GPUDASH = "/usr/local/bin/gpudash"  # the program the shipped unit names; replaced by this install's
# The rules' list of fleet jobs (gpudash:fleet_target:up), which --job replaces; a job name is written into a
# PromQL regex, so only names that need no quoting there are taken (dots are escaped).
FLEET_JOBS = re.compile(r'up\{job=~"([^"]*)"\}')
JOB_NAME = re.compile(r"[A-Za-z0-9_.:/-]+")
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")  # registry/name:tag or @digest, nothing YAML would read


def deploy_root() -> Path | None:
    """The deploy files of this gpudash: inside the installed package, else a source checkout's deploy/."""
    package = Path(gpudash.__file__).resolve().parent
    if (package / "deploy").is_dir():  # a wheel's
        return package / "deploy"
    checkout = package.parent
    if (checkout / "deploy").is_dir() and (checkout / "pyproject.toml").is_file():  # running from the source
        return checkout / "deploy"
    return None


def target_files(target: str) -> list[Path]:
    """The files one target writes, by name; a ClickException when the package lacks them."""
    root = deploy_root()
    folder, pattern = TARGETS[target]
    files = sorted((root / folder).glob(pattern)) if root is not None else []
    if not files:
        raise click.ClickException(f"this gpudash has no {target} files (looked in {root or 'the package'}); "
                                   "reinstall gpudash from its wheel or sdist")
    return files


def this_gpudash() -> str | None:
    """The `gpudash` program of this installation: the console script beside the interpreter (pip into a
    venv, pipx, uv tool); None where there is none (run as `python -m gpudash` from a checkout)."""
    beside = Path(sys.executable).parent / "gpudash"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    return None


def with_program(unit: str, program: str) -> str:
    """The unit text with ExecStart's program replaced by `program`."""
    out = []
    for line in unit.splitlines(keepends=True):
        if line.startswith("ExecStart=") and line[len("ExecStart="):].startswith(SHIPPED_GPUDASH):
            line = "ExecStart=" + program + line[len("ExecStart=") + len(SHIPPED_GPUDASH):]
        out.append(line)
    return "".join(out)


def with_jobs(rules: str, jobs: tuple[str, ...]) -> str:
    """The rules text with the fleet's job list replaced by `jobs` (their targets alert when they stop)."""
    pattern = "|".join(job.replace(".", "\\\\.") for job in jobs)  # \\. in the file is \. in PromQL's string
    replaced, count = FLEET_JOBS.subn(lambda _: f'up{{job=~"{pattern}"}}', rules, count=1)
    if count != 1:
        raise click.ClickException("this gpudash's rules file has no fleet job list to set; reinstall gpudash")
    return replaced


def contents(target: str, path: Path, jobs: tuple[str, ...] = (), image: str | None = None) -> str:
    text = path.read_text(encoding="utf-8")
    if target == "systemd" and (program := this_gpudash()) is not None:
        text = with_program(text, program)
    if target == "kubernetes":
        from gpudash.commands import deploy_kubernetes

        (rules,) = target_files("rules")
        return deploy_kubernetes.render(text, image or deploy_kubernetes.default_image(),
                                        contents("rules", rules, jobs))
    if jobs and "rules" in path.name:
        text = with_jobs(text, jobs)
    return text


DEPLOY_FILE_CAP = 4 << 20  # bytes of an existing file read to compare: the largest deploy file is ~100 KB


def _differs(path: Path, text: str) -> bool:
    """Whether `path` holds something other than `text`: nothing there is no difference; a link, a FIFO or a
    device (read without following or waiting) or a file larger than any deploy file is one."""
    try:
        return read_capped(path, DEPLOY_FILE_CAP) != text.encode("utf-8")
    except FileNotFoundError:
        return False
    except OSError:
        return True


@click.command()
@click.argument("target", type=click.Choice(sorted(TARGETS)))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the files into this folder (made if missing) instead of printing the one file.")
@click.option("--force", is_flag=True, default=False, help="Overwrite files in --out that differ.")
@click.option("--job", "jobs", multiple=True, metavar="NAME",
              help="A Prometheus job of the fleet whose targets alert when they stop answering (repeat it; "
                   "rules, prometheus and kubernetes only). Default: the jobs the shipped rules name.")
@click.option("--image", default=None, metavar="IMAGE",
              help="kubernetes only: the container image with gpudash in it (none is published; default "
                   "gpudash:VERSION, as the README builds it).")
def deploy(target: str, out: Path | None, force: bool, jobs: tuple[str, ...], image: str | None) -> None:
    """Write this version's Prometheus config, alert rules and their runbook, Grafana dashboard or systemd unit."""
    from gpudash.commands.common import usage_error

    if jobs and target not in ("rules", "prometheus", "kubernetes"):
        usage_error(f"--job sets the alert rules' fleet jobs; {target} has none (use it with rules, prometheus or "
                    "kubernetes)")
    if image is not None and target != "kubernetes":
        usage_error(f"--image sets the kubernetes DaemonSet's container image; {target} has none")
    if image is not None and not IMAGE.fullmatch(image):
        usage_error(f"--image {image!r} is not an image reference gpudash can write; use registry/name:tag")
    if bad := [job for job in jobs if not JOB_NAME.fullmatch(job)]:
        usage_error(f"--job {bad[0]!r} is not a job name gpudash can write into the rules; use letters, digits "
                    "and _ . : / - (as in your prometheus.yml's job_name)")
    files = {p.name: contents(target, p, jobs, image) for p in target_files(target)}
    if out is None:
        if len(files) > 1:
            usage_error(f"{target} is {len(files)} files ({', '.join(files)}); write them with --out DIR")
        click.echo(next(iter(files.values())), nl=False)
        _unit_notes(target, files)
        return
    if out.exists() and not out.is_dir():
        usage_error(f"--out {out} is a file; give a folder")
    clash = [name for name, text in files.items() if _differs(out / name, text)]
    if clash and not force:
        differ = "already exists and differs" if len(clash) == 1 else "already exist and differ"
        usage_error(f"{', '.join(str(out / n) for n in clash)} {differ}; pass --force to overwrite, or pick "
                    "another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_atomic(out / name, text, mode=0o644)  # whole files only: a reader never sees half of one
            click.echo(f"wrote {out / name}")
    except OSError as err:
        raise click.ClickException(f"cannot write into {out} ({err.strerror}); pick a writable folder") from None
    _unit_notes(target, files)


def hidden_paths(unit: str) -> dict[str, str]:
    """Folder -> the setting of `unit` that hides it from the service (or keeps its DynamicUser out)."""
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    hidden: dict[str, str] = {}
    if settings.get("PrivateTmp") in ("yes", "true", "1"):
        hidden |= {"/tmp": "PrivateTmp=yes", "/var/tmp": "PrivateTmp=yes"}
    if settings.get("ProtectHome", "no") not in ("no", "false", "0"):
        why = f"ProtectHome={settings['ProtectHome']} with DynamicUser=yes"
        hidden |= {"/root": why, "/home": why, "/run/user": why}
    return hidden


def needed_paths(program: str) -> list[Path]:
    """What ExecStart runs: the program, where its links lead, and the interpreter its #! line names."""
    paths = [Path(program), Path(program).resolve()]
    try:
        with open(program, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return paths
    if first.startswith(b"#!") and first[2:].split():
        interpreter = Path(first[2:].split()[0].decode(errors="replace"))
        paths += [interpreter, interpreter.resolve()]
    return paths


def _unit_notes(target: str, files: dict[str, str]) -> None:
    """Say when the unit names a gpudash it cannot run: the shipped path, or one its own sandbox hides."""
    if target != "systemd":
        return
    program = this_gpudash()
    if program is None:
        click.echo(f"note: ExecStart names {SHIPPED_GPUDASH}; edit it to where gpudash is installed", err=True)
        return
    hidden = hidden_paths(next(iter(files.values())))
    for path in needed_paths(program):
        blocked = [(folder, why) for folder, why in hidden.items() if path.is_relative_to(folder)]
        if blocked:
            folder, why = blocked[0]
            click.echo(f"note: ExecStart runs {path}, under {folder}, which the unit's {why} hides from it; "
                       "install gpudash where the service can read it (pipx install --global, or a venv under "
                       "/opt made by a Python outside home folders) and write the unit again", err=True)
            return
