"""`gpudash probe URL`: measure TTFT and prefix-cache hits of any OpenAI-compatible server."""

from __future__ import annotations

import dataclasses
import sys

import click

from gpudash.commands.common import db_option, db_path, pass_config, usage_error
from gpudash.commands.json_out import emit
from gpudash.config import Config
from gpudash.outside import printable
from gpudash.records import RequestSample
from gpudash.redact import mask_data


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} ms"


def _coef(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


@click.command()
@click.argument("url")
@click.option("--requests", "n", type=click.IntRange(min=1), default=20, show_default=True,
              help="Requests to send.")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=1, show_default=True,
              help="Requests in flight at once.")
@click.option("--shared-prefix", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="Fraction of requests that start with one shared prompt prefix (cache hits after the first).")
@click.option("--prompt-words", type=click.IntRange(min=1), default=None,
              help="Prompt length in words (default: [probe] prompt_tokens tokens, counted by the server).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Tokens generated per request (default: [probe] max_tokens).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, max=3600, min_open=True), default=None,
              help="Whole-request deadline in seconds (default: [probe] timeout_s).")
@db_option
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the summary and requests as JSON.")
@pass_config
def probe(cfg: Config, url: str, n: int, concurrency: int, shared_prefix: float, prompt_words: int | None,
          max_tokens: int | None, timeout_s: float | None, db: str | None, as_json: bool) -> None:
    """Send streaming chat requests to URL and summarize TTFT, cache hits and their correlation.

    Exits 1 when every request failed, 2 when the server cannot be probed at all."""
    import httpx

    from gpudash.launcher.probe.correlation import summarize
    from gpudash.launcher.probe.runner import run_probe
    from gpudash.launcher.probe.client import ProbeFailure
    from gpudash.records import as_row

    shown = printable(url)  # its password masked, as everywhere the URL is written
    if not url.startswith(("http://", "https://")):
        usage_error(f"URL '{shown}' must start with http:// or https://, e.g. http://127.0.0.1:8080")
    store = sid = None
    if db is not None:
        from gpudash.store import Store, StoreError

        try:
            store = Store.open(db_path(cfg, db))
        except StoreError as err:
            usage_error(str(err))
    deadline = timeout_s or cfg.probe.timeout_s
    try:
        samples = run_probe(url, n, concurrency, shared_prefix, prompt_words, max_tokens or cfg.probe.max_tokens,
                            deadline_s=deadline, prompt_tokens=None if prompt_words else cfg.probe.prompt_tokens)
    except (httpx.HTTPError, ProbeFailure) as err:
        if store is not None:
            store.close()
        cause = str(err) if isinstance(err, ProbeFailure) else f"{type(err).__name__}: {err}"
        usage_error(f"cannot probe {shown} ({printable(cause)}); start the server or fix the URL")
    except KeyboardInterrupt:
        if store is not None:
            store.close()
        click.echo("gpudash probe: interrupted", err=True)
        sys.exit(130)
    if store is not None:
        sid = store.begin_session("probe", cfg, note=f"gpudash probe {url}")
        store.insert_requests(sid, samples)
        store.end_session(sid)
        store.close()
    s = summarize(samples)
    if as_json:
        out = {"url": url, "session": sid, "summary": dataclasses.asdict(s), "requests": [as_row(r) for r in samples]}
        emit("probe", mask_data(out))
        _fail_if_all_failed(shown, samples)
        return
    c = s.correlation
    failed = f"{s.failed} failed, last: {printable(s.last_error)}" if s.failed else "0 failed"
    click.echo(f"{shown}: {s.requests} requests ({failed}), concurrency {concurrency}, "
               f"shared prefix {shared_prefix:g}")
    click.echo(f"  TTFT median {_ms(s.ttft_median_ms)}, p90 {_ms(s.ttft_p90_ms)}; "
               f"server prompt time median {_ms(s.server_prompt_median_ms)}")
    click.echo(f"  cache hits {s.hits}: TTFT median {_ms(s.hit_ttft_median_ms)}; "
               f"misses {s.misses}: TTFT median {_ms(s.miss_ttft_median_ms)}")
    mean = "n/a" if s.mean_hit_fraction is None else f"{s.mean_hit_fraction:.0%}"
    click.echo(f"  mean prompt share from cache {mean}; TTFT vs hit fraction: "
               f"Pearson {_coef(c.pearson)}, Spearman {_coef(c.spearman)} (n={c.n})")
    errors = sorted({r.error for r in samples if r.error})
    for e in errors[:3]:
        click.echo(f"  error: {printable(e)}", err=True)
    if sid is not None:
        click.echo(f"  recorded as session {sid}")
    _fail_if_all_failed(shown, samples)


def _fail_if_all_failed(url: str, samples: list[RequestSample]) -> None:
    """Exit 1 (the server failed, not the command line) when no request succeeded."""
    if samples and not any(r.ok for r in samples):
        click.echo(f"gpudash: every request to {url} failed (first: {printable(samples[0].error)})", err=True)
        sys.exit(1)
