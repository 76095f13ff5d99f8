"""`sandgym images build|list`: the offline stand-ins for public base images.

    sandgym images build [--only NAME]... [--force] [--desktop] [--envserver]
                         [--aliases auto|always|never] [--no-progress] [--json]
    sandgym images list [--json]

`build` makes sandgym's own images (images/bootstrap-base.sh: the Debian bases, the terminal
image, with --desktop/--envserver those too), then each stand-in of `lab/images.py`
(`STANDINS`), then tags the public names onto them: with `--aliases auto` (the default, or
`SANDGYM_STANDIN_ALIASES`) only names whose registry does not answer; a name held by an image
that is not ours is never touched. Idempotent: what is current is kept. A progress bar goes to
stderr; `--json` prints `{"steps":[{"name","result","seconds"}], "aliases":[{"name","image",
"status"}], "registries":{host: bool}, "error": str|null}`; exit status 1 on a failure.

`list` shows what stands in for what, read back from the engine's labels; `--json` prints
`{"stand_ins":[{"image","present","id","stands_in_for","really","python","aliases":[{"name",
"status"}]}], "unavailable":[{"names","reason","status"}], "own":[{"image","present"}],
"registries":{}}`. `--probe` also asks the registries whether they answer (one look-up each).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from lab import images as im

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="images_command", metavar="ACTION")
    b = sub.add_parser("build", help="build sandgym's images and the stand-ins, tag aliases")
    b.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="only this stand-in (our tag or a public name; repeatable; default: all)",
    )
    b.add_argument("--force", action="store_true", help="rebuild even what is current")
    b.add_argument("--desktop", action="store_true", help="also sandgym/desktop:latest")
    b.add_argument("--envserver", action="store_true", help="also sandgym/envserver:latest")
    b.add_argument(
        "--aliases",
        choices=im.ALIAS_MODES,
        default=im.alias_mode_default(),
        help="auto: tag public names only when no registry answers for them (default)",
    )
    b.add_argument("--log", default="/tmp/sandgym-images.log", help="build log file")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print one JSON document")
    ls = sub.add_parser("list", help="show what stands in for what")
    ls.add_argument("--probe", action="store_true", help="also probe the registries")
    ls.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(_images_parser=parser)


def _engine() -> im.ImageEngine:
    try:
        return im.ImageEngine()
    except ModuleNotFoundError as exc:  # the docker extra is not installed
        raise SystemExit(
            f"sandgym images: the docker SDK is missing ({exc}); pip install 'sandgym[docker]'"
        ) from exc
    except Exception as exc:
        raise SystemExit(f"sandgym images: no Docker engine answers ({exc})") from exc


def run(args: argparse.Namespace) -> int:
    if args.images_command == "list":
        return _list(args)
    if args.images_command == "build":
        return _build(args)
    args._images_parser.print_help()
    return 2


def _list(args: argparse.Namespace) -> int:
    engine = _engine()
    names = list(im.OWN_IMAGES)
    for s in im.STANDINS:
        names += [s.image, *s.aliases]
    for u in im.UNAVAILABLE:
        names += list(u.aliases)
    registries = engine.probe_registries(names) if args.probe else {}
    doc = im.list_report(engine.infos(names), registries)
    if args.json:
        print(json.dumps(doc))
    else:
        print(im.format_list(doc))
    return 0


def _build(args: argparse.Namespace) -> int:
    engine = _engine()
    log_path = Path(args.log)
    try:
        steps, report = im.build_plan(
            engine,
            only=args.only,
            force=args.force,
            desktop=args.desktop,
            envserver=args.envserver,
            aliases=args.aliases,
            log_path=log_path,
            on_line=lambda line: log.debug("build: %s", line),
        )
    except ValueError as exc:
        print(f"sandgym images build: {exc}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    bar: Any = tqdm(
        total=len(steps),
        unit="step",
        file=sys.stderr,
        disable=args.no_progress,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]",
    )
    error: str | None = None
    done: list[dict[str, Any]] = []
    with bar:
        for step in steps:
            bar.set_description_str(step.name)
            t0 = time.monotonic()
            try:
                result = step.run()
            except Exception as exc:  # a failed step ends the build; the report says which
                error = f"{step.name}: {exc}"
                done.append(
                    {
                        "name": step.name,
                        "result": "failed",
                        "seconds": round(time.monotonic() - t0, 1),
                    }
                )
                break
            done.append(
                {"name": step.name, "result": result, "seconds": round(time.monotonic() - t0, 1)}
            )
            bar.update(1)
        bar.set_description_str("images")
    report["steps"] = done
    report["error"] = error
    if args.json:
        print(json.dumps(report))
    else:
        for d in done:
            print(f"{d['result']:<10} {d['name']}  ({d['seconds']} s)", file=sys.stderr)
        tagged = [a["name"] for a in report["aliases"] if a["status"] == im.ALIAS]
        if tagged:
            print(f"aliases: {', '.join(tagged)}", file=sys.stderr)
        others = [
            f"{a['name']} ({a['status']})" for a in report["aliases"] if a["status"] != im.ALIAS
        ]
        if others:
            print(f"no alias: {', '.join(others)}", file=sys.stderr)
    if error:
        print(f"sandgym images build: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m lab.images_cli build|list` (what scripts/setup.sh runs)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    parser = argparse.ArgumentParser(prog="sandgym images", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
