"""Screenshots of the Dagster asset graph and an MLflow run comparison, taken from this checkout's own local state.

    .venv/bin/python scripts/screenshots.py [--out docs/figures] [--experiment NAME] [--only asset-graph]

Starts dagster-webserver on workspace.yaml with DAGSTER_HOME=.dagster_home (as `make dev`) and the MLflow UI on the
local tracking store (as `make mlflow-ui`; an http(s) MLFLOW_TRACKING_URI is used as it is), each on a free loopback
port, then drives headless Chromium over the DevTools protocol: the asset graph of the default job and the
compare-runs page of the experiment with the most runs (or --experiment). Both servers are stopped on every exit.

Chromium comes from the npm package @sparticuz/chromium, which carries the browser inside its tarball, so the npm
registry is the only download (no browser CDN); it is installed once under ~/.cache/rvu/chromium/<version>.
--chromium PATH uses another headless Chromium instead.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.scale.postgres_server import free_port  # a port free now on 127.0.0.1; the server binds it next

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
CHROMIUM_VERSION = "153.0.0"
CHROMIUM_PACKAGE = f"@sparticuz/chromium@{CHROMIUM_VERSION}"
CHROMIUM_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rvu" / "chromium"
# executablePath() inflates the browser and its swiftshader libraries into os.tmpdir(); TMPDIR points it at the cache.
INFLATE_JS = "import c from '@sparticuz/chromium'; console.log(await c.executablePath());"
# The flags the package's own launcher uses that matter outside a Lambda: one process, software GL, no sandbox.
CHROMIUM_FLAGS = (
    "--headless=shell",
    "--no-sandbox",
    "--no-zygote",
    "--single-process",
    "--use-gl=angle",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--hide-scrollbars",
    "--mute-audio",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--lang=en-US",
)
# ICU takes the locale from LANG; under LANG=C.UTF-8 it becomes "en-US@posix", which Intl.Collator rejects, and the
# Dagster UI then renders an empty page.
LOCALE_ENV = {"LANG": "en_US.UTF-8", "LANGUAGE": "en_US", "LC_ALL": "en_US.UTF-8"}
VIEWPORT = (1600, 1000)
DEFAULT_JOB = "default_profile_job"
MAX_COMPARED_RUNS = 4  # the compare page stays legible up to about this many columns
SERVER_TIMEOUT_S = 300.0  # dagster-webserver loads the code location first: tens of seconds on a busy machine
RENDER_TIMEOUT_S = 120.0
SETTLE_S = 3.0  # after the page reports ready: fit-to-view animation, late charts
SHOTS = ("asset-graph", "mlflow-comparison")
# Dagster UI state kept in the browser's localStorage: the first-visit newsletter dialog marked seen (the server-side
# "seen" flag would be a write to .dagster_home), the navigation rail collapsed, the graph pane at its widest.
DAGSTER_LOCAL_STORAGE = {
    "communityNux": '"1"',
    "dagster-nav-collapsed": "true",
    "dagster.panel-width.asset-graph-explorer": "100",
}
# MLflow UI state kept the same way: the assistant side panel shut (it opens itself on a first visit to a local
# server and takes a third of the width) and the sidebar on "Model training" rather than "GenAI".
MLFLOW_LOCAL_STORAGE = {
    "mlflow.assistant.panelOpen_v1": "false",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
    "mlflow.workflowType_v1": '"machine_learning"',
}
FIT_MARGIN = 0.94  # of the graph pane the fitted graph fills
GRAPH_TOOLBAR_PX = 56  # the zoom controls along the pane's right edge, left free
# The graph pane: the SVG that carries the layout's size (the largest one), its transformed layer and the viewport
# box around it.
GRAPH_GEOMETRY_JS = """(() => {
  const area = s => +s.getAttribute('width') * +s.getAttribute('height');
  const svg = [...document.querySelectorAll('svg[width][height]')].sort((a, b) => area(b) - area(a))[0];
  if (!svg || !svg.parentElement || !svg.parentElement.parentElement) return null;
  const layer = svg.parentElement.getBoundingClientRect();
  const box = svg.parentElement.parentElement.getBoundingClientRect();
  const width = +svg.getAttribute('width'), height = +svg.getAttribute('height');
  return {width, height, scale: layer.width / width, left: layer.left, top: layer.top,
          boxLeft: box.left, boxTop: box.top, boxWidth: box.width, boxHeight: box.height};
})()"""
NO_RUNS_HINT = "run `make run` first"


class ScreenshotError(RuntimeError):
    """A failure the user can act on; main() prints it without a traceback."""


def log(message: str) -> None:
    """Progress on stderr, so stdout stays free for the written paths."""
    print(f"screenshots: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pure parts: ports, URLs, choice of runs


def dagster_job_url(base: str, repository: str, location: str, job: str) -> str:
    """The job's page, which opens on its asset graph (the UI's route is /locations/<repo>@<location>/jobs/<job>)."""
    repo_path = urllib.parse.quote(f"{repository}@{location}", safe="@")
    return f"{base.rstrip('/')}/locations/{repo_path}/jobs/{urllib.parse.quote(job)}"


def mlflow_compare_url(base: str, run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """MLflow's compare-runs page: hash route with JSON lists, as the UI itself builds it (getCompareRunPageRoute)."""
    runs = urllib.parse.quote(json.dumps(list(run_ids), separators=(",", ":")))
    experiments = urllib.parse.quote(json.dumps(list(experiment_ids), separators=(",", ":")))
    return f"{base.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}"


def sqlite_uri_absolute(uri: str, root: Path) -> str:
    """A relative sqlite:/// store made absolute, so the MLflow UI can run from a scratch folder."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri.startswith(prefix + "/"):
        return uri
    return prefix + str((root / uri[len(prefix) :]).resolve())


@dataclass(frozen=True)
class Experiment:
    """An MLflow experiment and its active runs, newest first, as (run id, run name, status)."""

    experiment_id: str
    name: str
    runs: tuple[tuple[str, str, str], ...]


def choose_runs(experiments: Sequence[Experiment], requested: str | None, store: str) -> tuple[Experiment, list[str]]:
    """The experiment to show (the one with the most runs unless named) and up to MAX_COMPARED_RUNS of its runs.

    Finished runs are preferred, newest first. Fewer than two runs is an error that says how to make some."""
    with_runs = [e for e in experiments if e.runs]
    if not with_runs:
        raise ScreenshotError(f"no MLflow runs in {store}: {NO_RUNS_HINT}")
    if requested is not None:
        named = [e for e in experiments if e.name == requested]
        if not named:
            known = ", ".join(f"{e.name} ({len(e.runs)} runs)" for e in sorted(with_runs, key=lambda e: e.name))
            raise ScreenshotError(f"no MLflow experiment named {requested!r} in {store}; with runs: {known}")
        chosen = named[0]
    else:
        chosen = max(with_runs, key=lambda e: (len(e.runs), e.name))
    if len(chosen.runs) < 2:
        raise ScreenshotError(
            f"MLflow experiment {chosen.name!r} has {len(chosen.runs)} run(s); a comparison needs two: {NO_RUNS_HINT}"
        )
    finished = [run_id for run_id, _, status in chosen.runs if status == "FINISHED"]
    others = [run_id for run_id, _, status in chosen.runs if status != "FINISHED"]
    return chosen, (finished + others)[:MAX_COMPARED_RUNS]


def local_storage_js(origin: str, items: dict[str, str]) -> str:
    """A script run before each document of `origin` that presets its localStorage (UI state, not server state)."""
    sets = " ".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in items.items())
    return f"if (location.origin === {json.dumps(origin)}) {{ {sets} }}"


def zoom_wheel_delta(scale: float, target: float) -> float:
    """The ctrl+wheel deltaY that takes Dagster's graph viewport from `scale` to `target` in one event.

    Its wheel handler multiplies the scale by 1 - deltaY * k, with k = 0.002 for |deltaY| > 30 and 0.01 below."""
    change = 1.0 - target / scale
    delta = change / 0.002
    return delta if abs(delta) > 30 else change / 0.01


def text_ready_js(needles: Sequence[str], minimum: int, absent: Sequence[str] = ()) -> str:
    """A page-side check: at least `minimum` of the needles are visible text and none of `absent` is."""
    return (
        "(() => { const t = document.body ? document.body.innerText : '';"
        f" const found = {json.dumps(list(needles))}.filter(n => t.includes(n)).length;"
        f" const bad = {json.dumps(list(absent))}.some(n => t.includes(n));"
        f" return found >= {minimum} && !bad; }})()"
    )


# ---------------------------------------------------------------- HTTP and processes


def http_json(url: str, payload: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    """GET (or POST JSON) and decode the JSON answer; stdlib only, so the script needs nothing beyond the venv."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode())


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The end of a server's log, for an error message that shows why it did not come up."""
    if path is None:
        return "(no log)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def running(
    name: str, command: Sequence[str], *, cwd: Path, env: dict[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server in its own process group and always stop the whole group (its code servers too) on exit."""
    log(f"starting {name}: {' '.join(command)}")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            list(command), cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        stop_group(proc, name)


def stop_group(proc: subprocess.Popen[bytes], name: str, grace_s: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # The leader may be gone while children it left in the group linger; the group id is still theirs.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    log(f"stopped {name}")


def wait_until(
    check: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
) -> None:
    """Poll `check` until it holds; fail early if the server process died, with its log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ScreenshotError(f"{what}: process exited with {proc.returncode}\n{log_tail(log_path)}")
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            if check():
                return
        time.sleep(0.5)
    tail = f"\n{log_tail(log_path)}" if log_path else ""
    raise ScreenshotError(f"{what}: not ready after {timeout:.0f} s{tail}")


def http_ok(url: str) -> bool:
    """True once the URL answers 200."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


# ---------------------------------------------------------------- Chromium


def ensure_chromium(cache: Path = CHROMIUM_CACHE) -> Path:
    """The pinned @sparticuz/chromium binary, installed and inflated into the cache on first use."""
    home = cache / CHROMIUM_VERSION
    executable = home / "bin" / "chromium"
    if not os.access(executable, os.X_OK):
        npm, node = shutil.which("npm"), shutil.which("node")
        if not npm or not node:
            raise ScreenshotError("Chromium comes from npm (@sparticuz/chromium): install Node.js and npm first")
        log(f"installing {CHROMIUM_PACKAGE} into {home} (npm registry, about 75 MB)")
        home.mkdir(parents=True, exist_ok=True)
        (home / "bin").mkdir(exist_ok=True)
        install = [npm, "install", "--prefix", str(home), "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            subprocess.run([*install, CHROMIUM_PACKAGE], check=True, stdout=sys.stderr)
            inflated = subprocess.run(
                [node, "--input-type=module", "-e", INFLATE_JS],
                cwd=home,
                env={**os.environ, "TMPDIR": str(home / "bin")},
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        except subprocess.CalledProcessError as error:
            raise ScreenshotError(f"installing {CHROMIUM_PACKAGE} failed: {error} {error.stderr or ''}") from None
        if Path(inflated) != executable:
            raise ScreenshotError(f"@sparticuz/chromium inflated to {inflated}, expected {executable}")
    missing_libraries(executable)
    return executable


def missing_libraries(executable: Path) -> None:
    """Fail with the names ldd cannot resolve, instead of a browser that dies without a word."""
    if not shutil.which("ldd"):
        return
    env = {**os.environ, "LD_LIBRARY_PATH": chromium_library_path(executable)}
    out = subprocess.run(["ldd", str(executable)], capture_output=True, text=True, env=env).stdout
    missing = sorted({line.split()[0] for line in out.splitlines() if "not found" in line})
    if missing:
        raise ScreenshotError(f"{executable} lacks shared libraries: {', '.join(missing)} (install them with apt)")


def chromium_library_path(executable: Path) -> str:
    """The binary's own folder first: @sparticuz/chromium puts libEGL and swiftshader beside it."""
    return os.pathsep.join(p for p in (str(executable.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p)


class DevTools:
    """The few DevTools-protocol calls a screenshot needs, over one page's websocket."""

    def __init__(self, websocket: Any) -> None:
        self._ws = websocket
        self._next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """Send one command and return its result, skipping the events that arrive in between."""
        self._next_id += 1
        message_id = self._next_id
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") != message_id:
                continue
            if "error" in message:
                raise ScreenshotError(f"DevTools {method}: {message['error']}")
            return dict(message.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a page-side expression (None if it threw)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result.get("result", {}).get("value")


@contextlib.contextmanager
def chromium(executable: Path, workdir: Path) -> Iterator[DevTools]:
    """Headless Chromium on a port it picks itself (read back from DevToolsActivePort), connected to its blank page."""
    profile = workdir / "chromium-profile"
    command = [
        str(executable),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
        "about:blank",
    ]
    env = {**os.environ, **LOCALE_ENV, "LD_LIBRARY_PATH": chromium_library_path(executable)}
    log_path = workdir / "chromium.log"
    with running("chromium", command, cwd=workdir, env=env, log_path=log_path) as proc:
        port_file = profile / "DevToolsActivePort"
        wait_until(port_file.exists, what="chromium", timeout=60, proc=proc, log_path=log_path)
        wait_until(lambda: len(port_file.read_text().split()) >= 2, what="chromium", timeout=10, proc=proc)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in http_json(f"http://{HOST}:{port}/json/list") if t.get("type") == "page"]
        if not pages:
            raise ScreenshotError(f"chromium opened no page\n{log_tail(log_path)}")
        from websockets.sync.client import connect  # a dependency of uvicorn, which the webservers already need

        with connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as websocket:
            tools = DevTools(websocket)
            tools.call("Page.enable")
            tools.call("Emulation.setLocaleOverride", {"locale": "en-US"})
            tools.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False},
            )
            yield tools


def fit_graph(tools: DevTools, attempts: int = 12) -> None:
    """Zoom and pan Dagster's graph so all of it fills the pane: the UI's own fit clamps the zoom and may run
    before the layout's final size is known. Uses the viewport's wheel handling (ctrl+wheel zooms, wheel pans)."""
    for _ in range(attempts):
        g = tools.evaluate(GRAPH_GEOMETRY_JS)
        if not g or g["scale"] <= 0:
            raise ScreenshotError("asset graph: no graph in the page")
        width = g["boxWidth"] - GRAPH_TOOLBAR_PX
        target = min(1.0, FIT_MARGIN * min(width / g["width"], g["boxHeight"] / g["height"]))
        center_x, center_y = g["boxLeft"] + width / 2, g["boxTop"] + g["boxHeight"] / 2
        if abs(g["scale"] / target - 1.0) > 0.03:
            wheel = {"deltaX": 0, "deltaY": zoom_wheel_delta(g["scale"], target), "modifiers": 2}  # 2: ctrl
        else:
            dx = center_x - (g["left"] + g["width"] * g["scale"] / 2)
            dy = center_y - (g["top"] + g["height"] * g["scale"] / 2)
            if abs(dx) < 4 and abs(dy) < 4:
                return
            wheel = {"deltaX": -dx / 0.7, "deltaY": -dy / 0.7, "modifiers": 0}  # the handler pans by 0.7 * delta
        tools.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": center_x, "y": center_y, **wheel})
        time.sleep(0.4)
    log("asset graph: could not fit the graph exactly; taking it as it is")


def screenshot(
    tools: DevTools,
    url: str,
    ready_js: str,
    out: Path,
    what: str,
    prepare: Callable[[DevTools], None] | None = None,
) -> None:
    """Open the URL, wait until the page shows what it should, settle, and write the PNG (atomically)."""
    log(f"{what}: opening {url}")
    tools.call("Page.navigate", {"url": url})
    try:
        wait_until(lambda: tools.evaluate(ready_js) is True, what=f"{what} page", timeout=RENDER_TIMEOUT_S)
    except ScreenshotError:
        shown = tools.evaluate("document.body ? document.body.innerText.slice(0, 400) : ''")
        raise ScreenshotError(
            f"{what}: the page did not render in {RENDER_TIMEOUT_S:.0f} s; it shows: {shown!r}"
        ) from None
    time.sleep(SETTLE_S)
    if prepare is not None:
        prepare(tools)
        time.sleep(SETTLE_S)
    data = tools.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(base64.b64decode(data))
    os.replace(partial, out)
    log(f"{what}: wrote {out}")
    print(out)


# ---------------------------------------------------------------- the two servers


def venv_tool(name: str) -> str:
    """A console script of the interpreter running this file (.venv/bin/...), else one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise ScreenshotError(f"{name} not found: run `make setup` first")
    return found


def dagster_graphql(base: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """One GraphQL query against the webserver; GraphQL errors become ScreenshotError."""
    answer = http_json(f"{base}/graphql", {"query": query, "variables": variables or {}})
    if answer.get("errors"):
        raise ScreenshotError(f"Dagster GraphQL: {answer['errors']}")
    return dict(answer["data"])


LOCATIONS_QUERY = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on RepositoryLocation { repositories { name jobs { name } } }
  ... on PythonError { message } } } } } }"""
JOB_ASSETS_QUERY = """query ($job: String!, $repo: String!, $loc: String!) {
  assetNodes(pipeline: {pipelineName: $job, repositoryName: $repo, repositoryLocationName: $loc}) {
  assetKey { path } groupName } }"""


def dagster_job(base: str, job: str) -> tuple[str, str, list[str]]:
    """(repository, location, asset group names) of the job, once the code location has loaded (or its load error)."""
    deadline = time.monotonic() + SERVER_TIMEOUT_S
    while True:
        entries = dagster_graphql(base, LOCATIONS_QUERY)["workspaceOrError"]["locationEntries"]
        if entries and all(e["loadStatus"] == "LOADED" for e in entries):
            break
        if time.monotonic() > deadline:
            raise ScreenshotError("Dagster code location did not load")
        time.sleep(1.0)
    for entry in entries:
        loaded = entry["locationOrLoadError"]
        if loaded and loaded["__typename"] == "PythonError":
            raise ScreenshotError(f"Dagster code location {entry['name']} failed to load: {loaded['message']}")
        for repository in (loaded or {}).get("repositories", []):
            if any(j["name"] == job for j in repository["jobs"]):
                variables = {"job": job, "repo": repository["name"], "loc": entry["name"]}
                nodes = dagster_graphql(base, JOB_ASSETS_QUERY, variables)["assetNodes"]
                groups = sorted({n["groupName"] for n in nodes if n.get("groupName")})
                return repository["name"], entry["name"], groups
    raise ScreenshotError(f"no Dagster job named {job!r} in workspace.yaml")


def mlflow_experiments(base: str) -> list[Experiment]:
    """Every active experiment with its active runs (newest first), through the UI server's REST API."""
    found: list[Experiment] = []
    experiments = http_json(f"{base}/api/2.0/mlflow/experiments/search", {"max_results": 1000}).get("experiments", [])
    for experiment in experiments:
        runs: list[tuple[str, str, str]] = []
        token: str | None = None
        while True:
            payload: dict[str, Any] = {
                "experiment_ids": [experiment["experiment_id"]],
                "max_results": 1000,
                "order_by": ["attributes.start_time DESC"],
            }
            if token:
                payload["page_token"] = token
            answer = http_json(f"{base}/api/2.0/mlflow/runs/search", payload)
            for run in answer.get("runs", []):
                info = run["info"]
                runs.append((info["run_id"], info.get("run_name", ""), info.get("status", "")))
            token = answer.get("next_page_token")
            if not token:
                break
        found.append(Experiment(experiment["experiment_id"], experiment["name"], tuple(runs)))
    return found


def tracking_uri() -> str:
    """The store the pipelines write to (rvu_pipelines.tracking's default: .rvu/mlflow.db, or MLFLOW_TRACKING_URI)."""
    sys.path.insert(0, str(REPO))
    from rvu_pipelines.paths import default_tracking_uri

    return sqlite_uri_absolute(default_tracking_uri(), REPO)


# ---------------------------------------------------------------- main


def unwind(signum: int, _frame: object) -> None:
    """Turn SIGTERM/SIGHUP into SystemExit, so the with-blocks stop what they started."""
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "figures", help="folder for the PNGs")
    parser.add_argument("--experiment", help="MLflow experiment to compare runs of (default: the one with most runs)")
    parser.add_argument("--job", default=DEFAULT_JOB, help="Dagster job whose asset graph is shown")
    parser.add_argument("--only", choices=SHOTS, help="take one of the two screenshots")
    parser.add_argument("--chromium", type=Path, help="a headless Chromium to use instead of @sparticuz/chromium")
    args = parser.parse_args(argv)
    # A plain kill would skip the finally blocks and leave the servers and the browser running: unwind instead.
    previous = {sig: signal.signal(sig, unwind) for sig in (signal.SIGTERM, signal.SIGHUP)}
    shots = [args.only] if args.only else list(SHOTS)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="rvu-screenshots-") as scratch:
            take(shots, args, Path(scratch))
    except ScreenshotError as error:
        log(f"error: {error}")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


def take(shots: list[str], args: argparse.Namespace, workdir: Path) -> None:
    """Start the servers the shots need, side by side, then take the shots; the with-blocks stop everything."""
    executable = args.chromium or ensure_chromium()
    with contextlib.ExitStack() as stack:
        dagster_base = mlflow_base = ""
        dagster_proc: subprocess.Popen[bytes] | None = None
        mlflow_proc: subprocess.Popen[bytes] | None = None
        if "asset-graph" in shots:
            port = free_port()
            dagster_base = f"http://{HOST}:{port}"
            command = [venv_tool("dagster-webserver"), "-w", "workspace.yaml", "-h", HOST, "-p", str(port)]
            env = {**os.environ, "DAGSTER_HOME": str(REPO / ".dagster_home")}
            dagster_log = workdir / "dagster.log"
            dagster_proc = stack.enter_context(
                running("dagster-webserver", command, cwd=REPO, env=env, log_path=dagster_log)
            )
        if "mlflow-comparison" in shots:
            store = tracking_uri()
            if store.startswith(("http://", "https://")):
                mlflow_base = store.rstrip("/")
            else:
                port = free_port()
                mlflow_base = f"http://{HOST}:{port}"
                command = [venv_tool("mlflow"), "ui", "--backend-store-uri", store, "-h", HOST, "-p", str(port)]
                command += ["--workers", "1"]
                mlflow_log = workdir / "mlflow.log"
                mlflow_proc = stack.enter_context(
                    running("mlflow ui", command, cwd=workdir, env=dict(os.environ), log_path=mlflow_log)
                )
            wait_until(
                lambda: http_ok(f"{mlflow_base}/health"),
                what="MLflow UI",
                timeout=SERVER_TIMEOUT_S,
                proc=mlflow_proc,
                log_path=workdir / "mlflow.log",
            )
            experiment, run_ids = choose_runs(mlflow_experiments(mlflow_base), args.experiment, store)
            log(f"MLflow: comparing {len(run_ids)} of {len(experiment.runs)} runs of {experiment.name!r}")
        if dagster_base:
            wait_until(
                lambda: http_ok(f"{dagster_base}/server_info"),
                what="dagster-webserver",
                timeout=SERVER_TIMEOUT_S,
                proc=dagster_proc,
                log_path=workdir / "dagster.log",
            )
            repository, location, groups = dagster_job(dagster_base, args.job)
            log(f"Dagster: {args.job} has assets in {len(groups)} groups")
        tools = stack.enter_context(chromium(executable, workdir))
        for base, items in ((dagster_base, DAGSTER_LOCAL_STORAGE), (mlflow_base, MLFLOW_LOCAL_STORAGE)):
            if base:
                tools.call("Page.addScriptToEvaluateOnNewDocument", {"source": local_storage_js(base, items)})
        if dagster_base:
            url = dagster_job_url(dagster_base, repository, location, args.job)
            ready = text_ready_js(groups, minimum=len(groups), absent=("Loading",))
            screenshot(tools, url, ready, args.out / "asset-graph.png", "asset graph", prepare=fit_graph)
        if mlflow_base:
            url = mlflow_compare_url(mlflow_base, run_ids, [experiment.experiment_id])
            # run names, or the start of the id the table shows for a run without one
            labels = [name or run_id[:8] for run_id, name, _ in experiment.runs if run_id in run_ids]
            ready = text_ready_js(labels, minimum=len(labels))
            screenshot(tools, url, ready, args.out / "mlflow-comparison.png", "MLflow comparison")


if __name__ == "__main__":
    sys.exit(main())
