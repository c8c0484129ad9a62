"""`job submit`'s other ways: a job bought over x402, or its files served from here."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..client import BSM, load_key
from ..errors import ConfigError
from ..models import JobSpec
from .root import Ctx, _TokenUnit, emit


def _gateway_terms(url: str) -> dict[str, Any]:
    from ..paidjobs import gateway_terms

    return gateway_terms(url)


def _buy_job(ctx: Ctx, url: str, spec: JobSpec, unit: _TokenUnit | None) -> None:
    """`job submit --x402`: pay the gateway exactly the escrow, in its token, for the job."""
    from ..paidjobs import buy_job

    if not ctx.key:
        raise ConfigError("no key: pass --key or set DTRAIN_KEY (the account that pays)")
    assert unit is not None  # the gateway's token, read from its terms
    bought = buy_job(url, spec, load_key(ctx.key), spec.escrow, unit.address)
    amount = unit.format(bought.escrow)
    emit(
        ctx,
        {
            "job_id": bought.job_id,
            "escrow": bought.escrow,
            "token": bought.token,
            "owner": bought.payer,
            "settlement_tx": bought.settlement_tx,
            "create_tx": bought.create_tx,
        },
        f"job {bought.job_id} created by the gateway for {bought.payer}, {amount} escrowed "
        f"(paid in {bought.settlement_tx}, created in {bought.create_tx})",
    )


ANY_HOST = "0.0.0.0"


@dataclass(frozen=True)
class Listen:
    """Where `job submit --serve` listens (and what its URIs name), and where it packs folders."""

    host: str
    port: int
    cache_dir: Path


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise click.BadParameter(f"{host!r} is not an IP address", param_hint="--host") from None


def _start_serving(
    model_uri: str, dataset_uri: str, recipe_uri: str, listen: Listen
) -> tuple[Any, str, str, str | None]:
    """`job submit --serve`: the node package's data server, serving the job's local
    references; (server, model URI, dataset URI, recipe URI) to put in the job."""
    try:
        from dtrain_node.p2p.dataserve import DataServer, serve_job_files
    except ImportError as exc:
        raise ConfigError(
            f"--serve needs the node package (libp2p): pip install 'dtrain[node]' ({exc})"
        ) from None
    pack_dir = Path(listen.cache_dir).expanduser() / "sha256"
    server = DataServer(
        host=listen.host, port=listen.port, pack_dir=pack_dir
    ).start()  # its thread is a daemon: an error below ends it
    model_uri, dataset_uri, recipe_uri = serve_job_files(server, model_uri, dataset_uri, recipe_uri)
    return server, model_uri, dataset_uri, recipe_uri or None


def _serve_until_ended(ctx: Ctx, server: Any, bsm: BSM, job_id: int) -> None:
    from dtrain_node.p2p.dataserve import serve_until

    def ended() -> str | None:
        status = bsm.job(job_id).state.status
        return status.name.lower() if status.is_ended else None

    click.echo(f"serving job {job_id}'s files until it ends (Ctrl-C stops)", err=True)
    why = serve_until(ended, poll_s=5.0)
    sent = server.bytes_sent()
    server.stop()
    emit(
        ctx,
        {"job_id": job_id, "stopped_serving": why, "bytes_sent": sent},
        f"stopped serving: job {job_id} {why} ({sent / 1e6:.1f} MB sent)",
    )
