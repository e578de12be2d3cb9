"""The recovery commands of ``rvu``: recover, verify, restore and keys (kept apart from cli.py for length).

Exit codes follow cli.py's policy: 0 ok, 1 verification failed or recovery refused, 2 usage or input error.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

console = Console(soft_wrap=True)  # never break a path or a fingerprint across lines (copy-paste, grep)


def _embedder_for_recovery():
    """The profile's sentence embedder, named by model and sha256 so stores and certificates are portable."""
    from rvu_pipelines.models import ModelStore, load_model_config
    from rvu_pipelines.models.embedder import SentenceEmbedder

    resolved = ModelStore().resolve("embedder", load_model_config().profile()["embedder"])
    return SentenceEmbedder(resolved.path, name=f"{resolved.name}@{resolved.sha256[:12]}")


STATE_HELP = "Recovery state folder (default .rvu/recovery)."


def membership_line(probed: dict[str, Any]) -> str:
    """The membership probe's verdict in one line, naming the adapters the probe could not see while loaded: for
    them a ``clean`` is no evidence about what the adapter learned."""
    measured = (probed.get("adapters") or {}).items()
    unseen = sorted(name for name, row in measured if row.get("probe_saw_adapter") is False)
    line = f"membership probe: {probed.get('verdict', probed['status'])}"
    if "reason" in probed:
        line += f" ({probed['reason']})"
    if unseen:
        line += f"; the probe did not see {', '.join(unseen)} while loaded, so its verdict there says nothing"
        line += " about what the adapter learned"
    return line


@click.command()
@click.argument("incident", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--cert-out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the signed certificate (default .rvu/recovery/certificates/<incident>.json).",
)
@click.option("--state", type=click.Path(file_okay=False), default=None, help=STATE_HELP)
@click.option(
    "--max-depth",
    type=click.IntRange(min=0),
    default=None,
    help="Closure depth bound, overriding the policy's closure.max_depth; entries beyond it are left untouched "
    "and reported.",
)
@click.option(
    "--new-key",
    is_flag=True,
    help="Start a new signing key although earlier recoveries exist (their key was lost); earlier certificates "
    "then verify only against the old key's fingerprint.",
)
@click.option(
    "--detector",
    default="exfiltration",
    show_default=True,
    help="Contamination signal on the action records: exfiltration (the exfiltration heuristic), production "
    "(the calibrated injection detector in the MLflow registry) or any name `rvu detectors` lists.",
)
@click.option(
    "--membership/--no-membership",
    default=True,
    show_default=True,
    help="Measure every adapter the recovery evicts (members vs non-members rebuilt from its manifest, adapter "
    "loaded vs evicted) into the certificate's membership_probe section; loads the de-quantised base model only "
    "when an evicted adapter's files are at hand.",
)
def recover(
    incident: str,
    cert_out: str | None,
    state: str | None,
    max_depth: int | None,
    new_key: bool,
    detector: str,
    membership: bool,
) -> None:
    """Recover from an incident log without Dagster: ingest, closure, risk, tiers, signed certificate."""
    from rvu_pipelines.adapters.blocklist import record_evictions
    from rvu_pipelines.adapters.eviction_probe import probe_for_incident
    from rvu_pipelines.adapters.lingering import runtime_lingering
    from rvu_pipelines.adapters.recovery_gate import gate_for_incident
    from rvu_pipelines.detectors.catalog import by_name
    from rvu_pipelines.paths import default_tracking_uri
    from rvu_pipelines.provenance.incident import load_incident
    from rvu_pipelines.recovery import RecoveryOptions, RecoveryPaths
    from rvu_pipelines.recovery import recover as run_recovery
    from rvu_pipelines.recovery.pipeline import check_before_models

    paths = RecoveryPaths.default(state)
    log = load_incident(incident)  # validated once, first: a bad file changes nothing; recovery uses this copy
    files = paths.files_for(log.incident_id, cert_out)
    # what recovery would refuse without a model (a log a new store would refuse, an unwritable output, a lost
    # key), refused before the detector and the embedder load
    check_before_models(log, files, new_key)
    signal, _ = by_name(detector, default_tracking_uri())
    options = RecoveryOptions(
        detector=signal,
        embedder=_embedder_for_recovery(),
        gate=gate_for_incident(log),
        lingering=(purge := runtime_lingering()),
        probe=probe_for_incident(log, enabled=membership, lingering=purge.stores),
        max_depth=max_depth,
        new_key=new_key,
    )
    result = run_recovery(log, files, options)
    blocked = record_evictions(log, result.evicted_adapters)
    if blocked:
        console.print(f"evicted adapters blocklisted (sha256): {', '.join(b[:12] for b in blocked)}", highlight=False)
    if result.key_created:
        console.print(f"created signing key {result.key_fingerprint} in {paths.keys}", highlight=False)
    console.print(
        f"[bold]{escape(result.incident_id)}[/bold]: seeds {len(result.seeds)}, closure v1 {len(result.closure_v1)}, "
        f"v2 {len(result.closure_v2)}, tainted adapters {escape(str(result.tainted_adapters or 'none'))}",
        highlight=False,
    )
    console.print(f"tiers {result.tier_counts}; applied {result.applied}", highlight=False)
    counts = result.certificate["runtime_recovery"]["resulting_state"]["counts"]
    console.print(f"resulting state {counts}", highlight=False)
    for adapter_id, counts in sorted(purge.purged.items()):
        console.print(
            f"purged what evicted adapter {escape(adapter_id)} left on the runtime: "
            f"{counts['cached_answers']} cached answers, {counts['kv_states']} KV states",
            highlight=False,
        )
    console.print(escape(membership_line(result.certificate["membership_probe"])), highlight=False)
    if result.kept_restored:
        console.print(f"kept restored by operator decision: {escape(', '.join(result.kept_restored))}", highlight=False)
    for note in result.risk_notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]", highlight=False)
    if result.truncated_at_depth is not None:
        console.print(
            f"[yellow]closure truncated at depth {result.truncated_at_depth}: {result.entries_beyond_depth} "
            "reachable entries lie beyond it and were left untouched; re-run with a larger --max-depth[/yellow]",
            highlight=False,
        )
    console.print(f"certificate {escape(str(result.certificate_path))}", highlight=False)


def _explicit_pins(pins: tuple[str, ...], trust_files: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Fingerprints from --pin and --trust-file, and where they came from. A malformed pin, or a trust file
    without a single fingerprint, is an input error: a trust root is never left to a fallback because the
    file meant to name it was empty or half-written."""
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.recovery.signing_keys import normalize_fingerprint, read_trust_file

    found: list[str] = []
    for pin in pins:
        try:
            found.append(normalize_fingerprint(pin))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--pin") from None
    sources = ["--pin"] if pins else []
    for path in trust_files:
        listed = read_trust_file(path)
        if not listed:
            raise InputFileError(
                f"trust file {path}: holds no fingerprint (only blank or # comment lines), so it trusts nobody, "
                "and --trust-file never falls back to this machine's own key. Add the signer's fingerprint "
                "(sha256:..., one per line; the signer runs `rvu keys show`), or pass the trust file you meant."
            )
        found.extend(listed)
        sources.append(f"trust file {path}")
    return found, sources


def _machine_pins(state: str | None) -> tuple[list[str], list[str]]:
    """This machine's pins (default trust file, own key) and where they came from; creates nothing."""
    from rvu_pipelines.recovery.signing_keys import read_trust_file, trusted_fingerprint
    from rvu_pipelines.recovery.state import RecoveryPaths

    paths = RecoveryPaths.default(state, create=False)
    pins: list[str] = []
    sources: list[str] = []
    if paths.trust_file.is_file():
        pins.extend(read_trust_file(paths.trust_file))
        sources.append(f"trust file {paths.trust_file}")
    own = trusted_fingerprint(paths.keys)
    if own:
        pins.append(own)
        sources.append(f"this machine's key in {paths.keys}")
    return pins, sources


@click.command()
@click.argument("certificate", type=click.Path(dir_okay=False))
@click.option(
    "--pin",
    "--trust",
    "pins",
    multiple=True,
    metavar="FINGERPRINT",
    help="Trusted signer fingerprint (sha256:...; repeatable). With --pin or --trust-file only those are trusted; "
    "otherwise the state folder's trusted_keys.txt and this machine's own key.",
)
@click.option(
    "--trust-file",
    "trust_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="File of trusted fingerprints, one per line, # comments (repeatable); a file without any fingerprint is "
    "an error.",
)
@click.option(
    "--integrity-only",
    is_flag=True,
    help="Check digest and signature only, without knowing who signed: exit 0 says the file is intact, not "
    "that a trusted key signed it.",
)
@click.option("--state", type=click.Path(file_okay=False), default=None, help=STATE_HELP)
def verify(
    certificate: str, pins: tuple[str, ...], trust_files: tuple[str, ...], integrity_only: bool, state: str | None
) -> None:
    """Exit 0 if the certificate is intact and signed by a pinned key; 1 (with the reason) if not, including
    when no key is pinned; 2 for an unreadable file or bad option."""
    from rvu_pipelines.recovery.certificate import check_certificate

    if integrity_only:
        if pins or trust_files:
            raise click.UsageError("--integrity-only checks no signer; drop it, or drop --pin / --trust-file.")
        verdict = check_certificate(certificate)
        if not verdict.ok:
            _fail(verdict.reason)
        console.print(
            f"[yellow]INTEGRITY ONLY[/yellow]: the signature is self-consistent but the signer is NOT verified "
            f"(signed by {verdict.signer}); anyone can produce such a file with a key of their own.",
            highlight=False,
        )
        sys.exit(0)
    # --pin / --trust-file replace this machine's pins, never add to them: only what was named is trusted
    trusted, sources = _explicit_pins(pins, trust_files) if pins or trust_files else _machine_pins(state)
    if not trusted:
        verdict = check_certificate(certificate)
        if not verdict.ok:
            _fail(verdict.reason)
        _fail(
            f"UNVERIFIED SIGNER: the signature is self-consistent, but no trusted key is pinned on this machine, "
            f"so anyone could have signed it (signed by {verdict.signer}). Pass --pin FINGERPRINT or --trust-file "
            "PATH (the signer runs `rvu keys show`), or --integrity-only to check integrity alone."
        )
    verdict = check_certificate(certificate, trusted_fingerprints=trusted)
    if not verdict.ok:
        _fail(verdict.reason + f" (trusted: {', '.join(sources)})")
    console.print(f"[green]{escape(verdict.reason)}[/green] (trusted: {escape(', '.join(sources))})", highlight=False)


def _fail(reason: str) -> NoReturn:
    console.print(f"[red]INVALID[/red]: {escape(reason)}", highlight=False, soft_wrap=True)
    sys.exit(1)


@click.command()
@click.argument("entry_id")
@click.option("--state", type=click.Path(file_okay=False), default=None, help=STATE_HELP)
@click.option("--reason", default="operator", help="Recorded in the store's event log.")
def restore(entry_id: str, state: str | None, reason: str) -> None:
    """Lift the quarantine of ENTRY_ID: its vector is re-added to the index and the event logged. Later
    recoveries keep it restored (an operator decision) unless new evidence about it arrives."""
    from rvu_pipelines.recovery import restore as run_restore
    from rvu_pipelines.recovery.state import RecoveryPaths

    paths = RecoveryPaths.default(state, create=False)
    changed = run_restore(entry_id, paths.store, paths.index, reason=reason)
    console.print(
        f"restored {escape(entry_id)}" if changed else f"{escape(entry_id)} was not quarantined; nothing changed",
        highlight=False,
    )


@click.group()
def keys() -> None:
    """The certificate signing key: show or export its public half (the private key never leaves its folder)."""


def _public_key(state: str | None) -> tuple[str, bytes]:
    from rvu_pipelines.errors import InputFileError
    from rvu_pipelines.recovery.signing_keys import public_key_info
    from rvu_pipelines.recovery.state import RecoveryPaths

    folder = RecoveryPaths.default(state, create=False).keys
    info = public_key_info(folder)
    if info is None:
        raise InputFileError(f"No signing key in {folder}; the first `rvu recover` creates one (or pass --state).")
    return info


@keys.command("show")
@click.option("--state", type=click.Path(file_okay=False), default=None, help=STATE_HELP)
def keys_show(state: str | None) -> None:
    """Print the signing key's fingerprint and public key (what auditors pin)."""
    fingerprint, pem = _public_key(state)
    click.echo(f"fingerprint {fingerprint}")
    click.echo(pem.decode("ascii"), nl=False)


@keys.command("export")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--state", type=click.Path(file_okay=False), default=None, help=STATE_HELP)
def keys_export(path: str, state: str | None) -> None:
    """Write the public key (PEM) to PATH, for auditors on other machines."""
    from rvu_pipelines.atomic_write import write_atomically
    from rvu_pipelines.errors import InputFileError

    fingerprint, pem = _public_key(state)
    try:
        write_atomically(path, pem)  # a link at PATH or beside it is replaced, never written through
    except OSError as exc:
        raise InputFileError(f"Cannot write the public key to {path}: {exc.strerror or exc}.") from None
    click.echo(f"wrote public key {fingerprint} to {path}")
    click.echo(f"auditors add this line to their trusted_keys.txt: {fingerprint}")


RECOVERY_COMMANDS = (recover, verify, restore, keys)
