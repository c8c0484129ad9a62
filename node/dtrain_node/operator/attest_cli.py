"""`dtrain attest ...`: the TEE attestation service, the verifier contract and an operator's
attestation on the BSM (added to the SDK's CLI when the node is installed)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dtrain.attestation import AttestationVerifier
from dtrain.cli import Ctx, emit
from dtrain.client import load_key
from dtrain.errors import ConfigError
from dtrain.units import format_time
from dtrain_node.operator import attest
from dtrain_node.operator.attest_service import (
    VENDOR_CHECK_MISSING,
    AttestationRefused,
    AttestationService,
    load_answer,
    make_server,
    obtain,
    submit,
)

TSM_ROOT = click.option(
    "--tsm-root",
    type=click.Path(path_type=Path, file_okay=False),
    default=str(attest.TSM_REPORTS),
    show_default=True,
    help="configfs-tsm report directory.",
)


@click.group("attest")
def attest_group() -> None:
    """TEE attestation: the attestation service, its verifier contract, an operator's record."""


@attest_group.command("serve")
@click.option("--key", "service_key", required=True, help="The attestation service's signing key.")
@click.option("--verifier", required=True, help="SignedAttestationVerifier trusting that key.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8600, show_default=True, type=int, help="0 picks a free port.")
@click.option(
    "--ttl",
    default=86_400,
    show_default=True,
    type=click.IntRange(min=1),
    help="Seconds a statement stays valid.",
)
@click.option(
    "--no-vendor-check",
    is_flag=True,
    help="Required: this reference service does NOT verify the TEE vendor's certificate chain "
    "(Intel PCS / AMD VCEK) over a report; it checks only the report's binding.",
)
@click.pass_obj
def attest_serve(
    ctx: Ctx, service_key: str, verifier: str, host: str, port: int, ttl: int, no_vendor_check: bool
) -> None:
    """Sign statements for TEE reports bound to this chain, BSM, operator and peer key.

    It does not verify the vendor certificate chain of a report, so it refuses to start
    without --no-vendor-check: anyone able to post a report-shaped blob gets a statement.
    """
    if not no_vendor_check:
        raise AttestationRefused(VENDOR_CHECK_MISSING)
    service = AttestationService(
        signer=load_key(service_key),
        bsm=ctx.bsm(signing=False),
        verifier=verifier,
        ttl_s=ttl,
        vendor_check=not no_vendor_check,
    )
    server = make_server(service, host, port)
    click.echo(f"attestation service on http://{host}:{server.server_address[1]}", err=False)
    click.echo("warning: vendor certificate chains are NOT verified (--no-vendor-check)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@attest_group.command("deploy-verifier")
@click.option("--attester", required=True, help="Address of the attestation service's key.")
@click.option("--owner", default="", help="Owner (may rotate the key, pin measurements) [sender].")
@click.pass_obj
def attest_deploy_verifier(ctx: Ctx, attester: str, owner: str) -> None:
    """Deploy a SignedAttestationVerifier that trusts ATTESTER's signatures."""
    if not (ctx.rpc_url and ctx.key):
        raise ConfigError("deploy-verifier needs --rpc-url and --key")
    v = AttestationVerifier.deploy(ctx.rpc_url, ctx.key, attester, owner)
    emit(ctx, {"verifier": v.address, "attester": v.attester()}, v.address)


@attest_group.command("allow")
@click.argument("verifier")
@click.option("--disallow", is_flag=True, help="Disallow instead.")
@click.pass_obj
def attest_allow(ctx: Ctx, verifier: str, disallow: bool) -> None:
    """Allow VERIFIER's attestations for teeRequired jobs (blueprint developer only)."""
    bsm = ctx.bsm()
    bsm.set_attestation_verifier(verifier, not disallow)
    word = "disallowed" if disallow else "allowed"
    emit(ctx, {"verifier": verifier, "allowed": not disallow}, f"verifier {verifier} {word}")


@attest_group.command("request")
@click.option("--service", required=True, help="URL of the attestation service.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True)
@TSM_ROOT
@click.pass_obj
def attest_request(ctx: Ctx, service: str, out: Path, tsm_root: Path) -> None:
    """Get a signed statement for this operator (its registered peer key) and save it."""
    bsm = ctx.bsm()
    answer = obtain(service, bsm, bsm.sender, bsm.operator(bsm.sender).peer_key, tsm_root)
    out.write_text(json.dumps(answer, indent=1) + "\n")
    emit(ctx, answer, f"statement saved to {out}")


@attest_group.command("submit")
@click.option("--service", help="URL of the attestation service to ask now.")
@click.option(
    "--file",
    "path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A statement saved by `attest request`.",
)
@TSM_ROOT
@click.pass_obj
def attest_submit(ctx: Ctx, service: str | None, path: Path | None, tsm_root: Path) -> None:
    """Record this operator's attestation on the BSM (submitAttestation)."""
    if (service is None) == (path is None):
        raise click.UsageError("give exactly one of --service URL or --file PATH")
    bsm = ctx.bsm()
    if path is not None:
        answer = load_answer(path)
    else:
        answer = obtain(service, bsm, bsm.sender, bsm.operator(bsm.sender).peer_key, tsm_root)
    submit(bsm, answer)
    a = bsm.attestation_of(bsm.sender)
    emit(ctx, a, f"attestation recorded, valid until {format_time(a.expires_at)}")


@attest_group.command("show")
@click.argument("operator", required=False)
@click.pass_obj
def attest_show(ctx: Ctx, operator: str | None) -> None:
    """Show OPERATOR's recorded attestation (default: the --key account)."""
    bsm = ctx.bsm(signing=operator is None)
    a = bsm.attestation_of(operator or bsm.sender)
    human = (
        f"valid: {a.valid}  verifier: {a.verifier}  tee type: {a.tee_type}  "
        f"expires: {format_time(a.expires_at) if a.expires_at else '-'}"
    )
    emit(ctx, a, human)


def register(root: click.Group) -> None:
    root.add_command(attest_group)
