"""`top`: who uses each GPU of a running plugin, as a table refreshed every second.

It reads the plugin's `/status` (the `usage` part: per GPU, its devices, the containers holding
replicas of them or running on them) and prints one frame: a line per GPU or MIG device, then
a line per container, like nvidia-smi's process list grouped by pod. It fits 80 columns; pod
names are shortened from the middle when they do not. `--once` prints a single frame (no
screen control) and exits; otherwise the screen is redrawn every second until Ctrl-C.

Exit codes: 0, 1 when the plugin cannot be read (with `--once`; the refreshing view keeps
trying and says why), 2 for a bad `--url`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import urllib.parse
from typing import Any

from sharing_plugin.cli.common import EXIT_INVALID, EXIT_OK, EXIT_USAGE, add_env_flags

DEFAULT_URL = "http://127.0.0.1:9400"
WIDTH = 80
_TIMEOUT_S = 2.0
_REFRESH_S = 1.0
_CLEAR = "\x1b[H\x1b[2J"
# GPU, POD, REPLICAS, MEMORY, SM: 6 + 1 + 36 + 1 + 9 + 1 + 19 + 1 + 6 = 80
_COLUMNS = (6, 36, 9, 19, 6)
_GIB = 1 << 30


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("top", help="who uses each GPU of a running plugin (its /status)")
    add_env_flags(
        top,
        (("--url", "SHARING_PLUGIN_URL", DEFAULT_URL, "the plugin's metrics address, as a URL"),),
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument(
        "--cluster",
        action="store_true",
        help="every node's plugin, through the API server's pod proxy (not --url)",
    )
    top.add_argument("--node", default=None, help="with --cluster: this node's plugin only")
    top.add_argument(
        "--namespace", default=None, help="with --cluster: only the containers of this namespace"
    )
    add_env_flags(
        top,
        (
            (
                "--plugin-namespace",
                "SHARING_PLUGIN_NAMESPACE",
                "kube-system",
                "with --cluster: the namespace the plugin's pods run in",
            ),
            (
                "--selector",
                "SHARING_PLUGIN_SELECTOR",
                "app.kubernetes.io/name=gpu-sharing-plugin",
                "with --cluster: the label selector of the plugin's pods",
            ),
            (
                "--timeout",
                "SHARING_PLUGIN_TIMEOUT",
                "5",
                "with --cluster: seconds each node's plugin has to answer",
            ),
        ),
    )
    top.set_defaults(func=_cmd_top)


def _cmd_top(args: argparse.Namespace) -> int:
    if args.cluster:
        from sharing_plugin.cli import top_cluster

        return top_cluster.command(args)
    if args.node or args.namespace:
        print("sharing-plugin top: --node and --namespace need --cluster", file=sys.stderr)
        return EXIT_USAGE
    try:
        url = status_url(args.url)
    except ValueError as exc:
        print(f"sharing-plugin top: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.once:
        try:
            document = fetch(url)
        except OSError as exc:
            print(f"sharing-plugin top: {url}: {_reason(exc)}", file=sys.stderr)
            return EXIT_INVALID
        print("\n".join(frame(document, source=args.url)))
        return EXIT_OK
    try:
        while True:
            try:
                lines = frame(fetch(url), source=args.url)
            except OSError as exc:
                lines = [f"sharing-plugin top: {url}: {_reason(exc)} (retrying)"]
            sys.stdout.write(_CLEAR + "\n".join(lines) + "\n")
            sys.stdout.flush()
            time.sleep(_REFRESH_S)
    except KeyboardInterrupt:
        return EXIT_OK


def status_url(base: str) -> str:
    """`http://HOST:PORT` (a path is ignored) -> its `/status` URL."""
    parts = urllib.parse.urlsplit(base.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url must be http://HOST:PORT (got {base!r})")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/status", "", ""))


def fetch(url: str) -> dict[str, Any]:
    """The plugin's `/status` document; OSError (URLError included) when it cannot be read."""
    import urllib.request  # http.client, ssl, email: ~16 ms every other command need not pay

    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
        body = response.read()
    try:
        document = json.loads(body)
    except ValueError:
        raise OSError("the answer is not JSON: is this the plugin's metrics address?") from None
    if not isinstance(document, dict):
        raise OSError("the answer is not the plugin's /status document")
    return document


def frame(document: dict[str, Any], *, source: str) -> list[str]:
    """One screen of the table, each line at most `WIDTH` characters."""
    config = document.get("config") or {}
    named = config.get("name") or "-"
    digest = (config.get("hash") or "")[:8]
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    title = f"{source}  config {named} {digest} (generation {config.get('generation', 0)})"
    lines = [
        _fit(f"{title:<{WIDTH - 9}} {stamp}"),
        _row("GPU", "POD", "REPLICAS", "MEMORY USED/SHARE", "SM"),
    ]
    usage = document.get("usage")
    if not isinstance(usage, dict):
        lines.append("no GPU usage yet: the plugin has not applied a config")
        return lines
    for gpu in usage.get("gpus") or ():
        lines.append(
            _row(
                str(gpu.get("index", "?")),
                str(gpu.get("product", "")),
                "",
                _of(gpu.get("memoryUsed", 0), gpu.get("memoryTotal", 0)),
                "",
            )
        )
        for device in gpu.get("devices") or ():
            lines += _device(gpu, device)
    if not usage.get("utilization"):
        lines.append("SM: NVML gives no per-process utilization on these GPUs (memory only)")
    for problem in usage.get("problems") or ():
        lines.append(_fit(f"! {problem}"))
    if document.get("lastError"):
        lines.append(_fit(f"last error: {document['lastError']}"))
    return lines


def _device(gpu: dict[str, Any], device: dict[str, Any]) -> list[str]:
    lines = []
    if device.get("mig"):
        lines.append(
            _row(
                str(device.get("index", "")),
                f"MIG {device['mig']}",
                "",
                _of(device.get("memoryUsed", 0), device.get("memoryTotal", 0)),
                "",
            )
        )
    shares = {s.get("resource"): s for s in device.get("shares") or ()}
    for c in device.get("containers") or ():
        if c.get("pod"):
            who = "/".join(p for p in (c.get("namespace"), c.get("pod"), c.get("container")) if p)
        else:
            pids = ", ".join(str(p) for p in c.get("pids") or ())
            who = f"(pid {pids}, unattributed)"
        share = shares.get(c.get("resource"))
        held = len(c.get("replicas") or ())
        replicas = (
            f"{held}/{share['replicas']}" if share and held else ("-" if not held else str(held))
        )
        used = c.get("memoryUsed", 0)
        memory = _memory(used, c.get("share", 0)) if c.get("pod") else _gib(used)
        if isinstance(c.get("cap"), int):
            memory += f" cap {c['cap'] / _GIB:.1f}"
        if c.get("overShare"):
            memory += " !"
        utilization = c.get("utilization")
        sm = f"{round(utilization * 100)}%" if isinstance(utilization, int | float) else "-"
        lines.append(_row("", "  " + who, replicas, memory, sm))
    return lines


def _row(gpu: str, pod: str, replicas: str, memory: str, sm: str) -> str:
    cells = (gpu, _middle(pod, _COLUMNS[1]), replicas, memory, sm)
    text = " ".join(f"{cell[:width]:<{width}}" for cell, width in zip(cells, _COLUMNS, strict=True))
    return text.rstrip()


def _middle(text: str, width: int) -> str:
    """`text` shortened from the middle to `width` (pod names differ at both ends)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: (keep + 1) // 2] + "~" + text[len(text) - keep // 2 :]


def _gib(value: Any) -> str:
    return f"{(value or 0) / _GIB:.1f} GiB"


def _memory(used: Any, share: Any) -> str:
    return f"{(used or 0) / _GIB:.1f}/{(share or 0) / _GIB:.1f} GiB"


def _of(used: Any, total: Any) -> str:
    return f"{(used or 0) / _GIB:.1f} of {(total or 0) / _GIB:.1f} GiB"


def _fit(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "~"


def _reason(exc: OSError) -> str:
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)
