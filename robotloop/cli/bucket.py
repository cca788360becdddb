"""`robotloop bucket ...`: list, upload, download, sizes, and the bucket server itself."""

from __future__ import annotations

import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from services.bucket import BucketOptions
from services.options import serve_command

from ..config import load_settings
from ..storage import BadBucketUrl, BucketUrl, Entry, NotFound, connect
from .output import JsonOutput, QuietOutput, cli_console, fail, print_json, show, transfer_progress

app = typer.Typer(no_args_is_help=True, help="Work with Xet storage buckets (hf://buckets/<ns>/<bucket>/<path>).")
console = cli_console()  # a line stays one line, on a narrow terminal and in a pipe

UrlArg = Annotated[str, typer.Argument(help="hf://buckets/<namespace>/<bucket>\\[/<path>]")]


def _url(text: str) -> BucketUrl:
    try:
        return BucketUrl.parse(text)
    except BadBucketUrl as error:
        raise typer.BadParameter(str(error)) from None


@app.command()
def create(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="hf://buckets/<namespace>/<bucket>")],
    public: bool = typer.Option(False, help="Allow anonymous reads."),
) -> None:
    """Create a bucket (private unless --public)."""
    root = BucketUrl(_url(url).bucket_id, "")
    client = connect(ctx.obj)
    try:
        client.ls(root)
        console.print(f"{root} exists already (left as it is)")
        return
    except NotFound:
        client.create_bucket(root, private=not public)
    console.print(f"created {root} ({'public' if public else 'private'})")


@app.command("list")
def list_buckets(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Argument(help="A namespace (user or organization), e.g. lab.")],
    as_json: JsonOutput = False,
) -> None:
    """The buckets of a namespace: size, files, private or public."""
    buckets = connect(ctx.obj).list_buckets(namespace.removeprefix("hf://buckets/").strip("/"))
    if as_json:
        return print_json(buckets)
    if not buckets:
        return console.print(f"no buckets in {namespace}", highlight=False)
    rows = [
        (f"{b['total_files']:,}", f"{b['size']:,}", _access(b["private"]), f"hf://buckets/{b['id']}") for b in buckets
    ]
    _print_columns(("files", "size", "access", "bucket"), rows, numbers=2)


def _access(private: bool) -> str:
    return "private" if private else "public"


@app.command()
def delete(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="hf://buckets/<namespace>/<bucket>")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask: delete it and every file in it.")] = False,
) -> None:
    """Delete a bucket and every file in it, for good (asks first unless --yes)."""
    target = _url(url)
    if target.path:
        raise typer.BadParameter(f"{url}: a bucket, not a path in one (files: robotloop bucket rm)", param_hint="URL")
    root = BucketUrl(target.bucket_id, "")
    if not yes and not typer.confirm(f"delete {root} and every file in it, for good?"):
        raise typer.Exit(1)
    connect(ctx.obj).delete_bucket(root)
    console.print(f"deleted {root}")


@app.command()
def ls(
    ctx: typer.Context,
    url: UrlArg,
    recursive: bool = typer.Option(False, "-R", "--recursive", help="Every file below, not only the first level."),
    as_json: JsonOutput = False,
) -> None:
    """List files and folders (--json: each as {"type": "file", "path", "size", "xet_hash"} or
    {"type": "directory", "path"}, as huggingface_hub's list_bucket_tree names them)."""
    target = _url(url)
    entries = connect(ctx.obj).ls(target, recursive=recursive)
    if not entries and target.path:  # a mistyped path is not an empty folder (buckets have no empty folders)
        raise fail(f"nothing at {target}")
    if as_json:
        return print_json([_entry_json(e) for e in entries])
    rows = [
        (f"{e.size:,}", e.xet_hash[:12], e.url.path) if isinstance(e, Entry) else ("", "", e.path + "/")
        for e in entries
    ]
    _print_columns(("size", "xet hash", "path"), rows)


def _print_columns(header: tuple[str, ...], rows: list[tuple[str, ...]], numbers: int = 1) -> None:
    """A listing, one line per row: the columns padded to line up, the last one (a path, a URL) never cut, padded
    or wrapped, so a narrow terminal wraps a long line whole and a pipe gets every path as it is (rich's tables cut
    cells to the width, which is 80 columns in a pipe). The first `numbers` columns align right."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    for row in (header, *rows):
        cells = [
            cell.rjust(width) if i < numbers else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row[:-1], widths, strict=True))
        ]
        print("  ".join((*cells, row[-1])))  # plain print: a path is text, not rich markup


def _entry_json(e: Entry | BucketUrl) -> dict:
    if isinstance(e, Entry):
        return {"type": "file", "path": e.url.path, "size": e.size, "xet_hash": e.xet_hash}
    return {"type": "directory", "path": e.path}


@app.command()
def put(
    ctx: typer.Context,
    local: Annotated[Path, typer.Argument(help="File or folder to upload.")],
    url: UrlArg,
    create: bool = typer.Option(True, help="Create the bucket if missing."),
    quiet: QuietOutput = False,
    as_json: JsonOutput = False,
) -> None:
    """Upload a file or a folder; prints how many bytes were new and how many deduplicated. As with `cp`, a file
    put to an existing folder, or to a URL ending in `/`, goes into it. A progress bar on stderr while it runs (in
    a terminal, without --quiet or --json)."""
    target = _url(url)
    if url.endswith("/") and local.is_file() and target.path:
        target = target / local.name
    client = connect(ctx.obj)
    if create:
        client.create_bucket(target)
    with transfer_progress("uploading", off=quiet or as_json) as progress:
        report = client.upload(local, target, progress)
    if not report.files:
        raise fail(f"{local}: no files in it, nothing was uploaded")
    summary = {
        "url": str(target),
        "files": [asdict(f) for f in report.files],
        "bytes_total": report.bytes_total,
        "bytes_new": report.bytes_new,
        "bytes_deduplicated": report.bytes_deduplicated,
        "bytes_sent": report.bytes_sent,
    }
    show(summary, as_json, _put_text)


def _put_text(s: dict) -> str:
    return (
        f"uploaded {len(s['files'])} file(s), {s['bytes_total']:,} bytes: {s['bytes_new']:,} new, "
        f"{s['bytes_deduplicated']:,} deduplicated, {s['bytes_sent']:,} sent"
    )


@app.command()
def get(
    ctx: typer.Context,
    url: UrlArg,
    dest: Annotated[Path, typer.Argument(help="File or folder.")] = Path("."),
    quiet: QuietOutput = False,
    as_json: JsonOutput = False,
) -> None:
    """Download a file, or every file under a folder. A progress bar on stderr while it runs (in a terminal,
    without --quiet or --json)."""
    target = _url(url)
    with transfer_progress("downloading", off=quiet or as_json) as progress:
        paths = connect(ctx.obj).fetch(target, dest, progress)
    if not paths:
        raise fail(f"nothing under {target}")
    show({"url": str(target), "files": [str(p) for p in paths]}, as_json, lambda s: _get_text(s, dest))


def _get_text(s: dict, dest: Path) -> str:
    return f"downloaded {len(s['files'])} file(s) to {dest}"


@app.command()
def rm(
    ctx: typer.Context,
    url: UrlArg,
    recursive: bool = typer.Option(False, "-R", "--recursive", help="A folder: every file under it."),
) -> None:
    """Delete a file, or with -R every file under a folder (one batch)."""
    target = _url(url)
    paths = connect(ctx.obj).delete(target, recursive=recursive)
    console.print(f"deleted {len(paths)} file(s) under {target}")


@app.command()
def du(ctx: typer.Context, url: UrlArg, as_json: JsonOutput = False) -> None:
    """Total size of the files under a URL."""
    target = _url(url)
    result = {"url": str(target), "bytes": connect(ctx.obj).du(target)}
    show(result, as_json, lambda r: f"{r['bytes']:,} bytes\t{url}")


@app.command()
def scrub(
    root: Annotated[
        Path, typer.Option(help="The bucket server's data root (the embedded server's: see `bucket server status`).")
    ] = Path("buckets"),
    database: Annotated[
        str | None, typer.Option(help="The server's --database (postgresql://...), if its index is in PostgreSQL.")
    ] = None,
) -> None:
    """Check every stored xorb and shard of a bucket server's data root against its hash; name what is damaged.

    Exit 1 when anything is. Damaged xorbs are never served; uploading the affected files again repairs them.
    """
    from ..storage.server.files import scrub_root

    if database is None and not (root / "cas" / "index.sqlite").is_file():
        inside = root / "data"  # the embedded server's folder: its data root is in it
        hint = f"; the one in it is {inside}" if (inside / "cas" / "index.sqlite").is_file() else ""
        raise fail(f"{root}: not a bucket server's data root (no cas/index.sqlite){hint}")
    report = scrub_root(root, database)
    console.print(f"checked {report['xorbs']} xorbs and {report['shards']} shards under {root}")
    for item in report["damaged"]:
        console.print(f"[red]damaged[/red] xorb {item['xorb']}: {item['detail']}")
        for path in item["paths"] or ["(no bucket file uses it)"]:
            console.print(f"  breaks {path}")
    for shard in report["damaged_shards"]:
        console.print(f"[red]damaged[/red] shard {shard}")
    if report["damaged"] or report["damaged_shards"]:
        raise typer.Exit(1)
    console.print("nothing damaged")


app.command("serve")(serve_command(BucketOptions, "services.bucket.app", fail))


server_app = typer.Typer(
    no_args_is_help=True,
    help="The embedded bucket server (what commands start on localhost when no endpoint is configured): "
    "see it, start it, stop it, and the environment other tools (hf, lerobot, curl) need to reach it.",
)
app.add_typer(server_app, name="server")


def _embedded_root(ctx: typer.Context) -> Path:
    return (ctx.obj or load_settings()).storage.embedded_root


def _server_state(root: Path, server) -> dict:
    """`root`: the embedded server's folder; its "root" here is the data root under it, which `bucket scrub --root`
    and `bucket serve --root` take. "clients": the pids of the processes using it (holding a lease)."""
    from ..storage.embedded import data_root, server_clients

    return {
        "running": server is not None,
        "endpoint": server.endpoint if server else None,
        "pid": server.pid if server else None,
        "clients": server_clients(root) if server else [],
        "root": str(data_root(root)),
        "log": str(root / "server.log"),
    }


def _server_text(state: dict) -> str:
    if not state["running"]:
        return f"not running (data root {state['root']}; any robotloop command starts it)"
    used = f"used by pid {', '.join(map(str, state['clients']))}" if state["clients"] else "used by no process now"
    return f"running at {state['endpoint']} (pid {state['pid']}), {used}, data root {state['root']}, log {state['log']}"


@server_app.command("status")
def server_status(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """Whether the embedded server runs, where, and its data root and log."""
    from ..storage.embedded import embedded_server

    root = _embedded_root(ctx)
    show(_server_state(root, embedded_server(root)), as_json, _server_text)


@server_app.command("start")
def server_start(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """Start the embedded server (or find the one running); it keeps running after this command."""
    from ..storage.embedded import ensure_embedded_server

    root = _embedded_root(ctx)
    server = ensure_embedded_server(root)
    show(_server_state(root, server), as_json, _server_text)


@server_app.command("stop")
def server_stop(
    ctx: typer.Context,
    force: bool = typer.Option(False, "--force", help="Stop it even while other processes use it (they then fail)."),
) -> None:
    """Stop the embedded server; the next command that needs it starts it again. It is shared by every robotloop
    process of this user (every checkout, every run): while another one uses it, this refuses and names its pid,
    unless --force."""
    from ..storage.embedded import stop_embedded_server

    stopped = stop_embedded_server(_embedded_root(ctx), force=force)
    console.print("stopped" if stopped else "not running")


@server_app.command("env")
def server_env(ctx: typer.Context) -> None:
    """Print `export HF_ENDPOINT=... HF_TOKEN=...` for the embedded server (started if it is not running), so hf,
    lerobot (`repo_type="bucket"`) and curl reach it: `eval "$(robotloop bucket server env)"`. The token is the
    local write token (in `<root>/tokens`, mode 0600): keep it to this machine."""
    from ..storage.embedded import ensure_embedded_server

    server = ensure_embedded_server(_embedded_root(ctx))
    print(f"export HF_ENDPOINT={shlex.quote(server.endpoint)}")
    print(f"export HF_TOKEN={shlex.quote(server.token)}")
