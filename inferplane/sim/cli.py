"""``inferplane simulate scenario.yaml [--out DIR] [--seed N]``: run a scenario, report it.

Runs every policy the scenario lists on the same seeded workload, with a progress bar per
policy, then prints the side-by-side summary and writes ``result.json`` (byte-identical for
the same seed) and ``report.html`` into the output folder. A bad scenario, fleet config or
trace exits with status 2 and a message naming what is wrong, never a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from inferplane.sim.records import RunResult


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean bad input (named in their message), not a bug."""
    from inferplane.config import ConfigError
    from inferplane.sim.faults import FaultError
    from inferplane.sim.fleet import FleetError
    from inferplane.sim.scenario import ScenarioError
    from inferplane.sim.traces import TraceError

    return (ConfigError, FaultError, FleetError, ScenarioError, TraceError)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a fleet, workload and faults in virtual time and compare policies",
        description=__doc__,
    )
    parser.add_argument("scenario", type=Path, help="scenario YAML file")
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: ./sim-<name>)"
    )
    parser.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    parser.add_argument("--policies", default=None, help="comma-separated subset of policies")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML report")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table")
    parser.set_defaults(func=run_command)
    plan = subparsers.add_parser(
        "plan",
        help="find the cheapest fleet per GPU type that meets SLOs at a given demand",
        description="Simulate fleets of each candidate GPU type (doubling, then bisection) "
        "and report the cheapest one meeting the plan's SLOs, with every fleet tried.",
    )
    plan.add_argument("plan", type=Path, help="plan YAML file")
    plan.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    plan.set_defaults(func=plan_command)


def simulate(
    scenario_path: Path, *, seed: int | None = None, policies: list[str] | None = None,
    quiet: bool = True,
) -> tuple[dict[str, Any], list[RunResult]]:  # fmt: skip
    """Run a scenario file; returns the result document and the per-policy runs."""
    from inferplane.config import load_config
    from inferplane.sim.calibrated import CalibratedSimulation
    from inferplane.sim.report import build_result
    from inferplane.sim.scenario import load_scenario, parse_scenario

    scenario = load_scenario(scenario_path)
    if policies:
        data = {**scenario.model_dump(mode="json"), "policies": policies}
        scenario = parse_scenario(data, f"{scenario_path} (with --policies)")
    base_dir = scenario_path.parent
    fleet_config = load_config(base_dir / scenario.fleet)
    run_seed = scenario.seed if seed is None else seed
    results: list[RunResult] = []
    progress = None if quiet else _progress()
    with progress or _null():
        for name in scenario.policies:
            hook = None
            if progress is not None:
                task = progress.add_task(name, total=scenario.duration_s + scenario.drain_s)
                hook = _hook(progress, task)
            sim = CalibratedSimulation(
                scenario, fleet_config, base_dir, name, seed=run_seed, progress=hook
            )
            results.append(sim.run())
            if progress is not None:
                progress.update(task, completed=scenario.duration_s + scenario.drain_s)
    return build_result(scenario, run_seed, results), results


def _progress() -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:<14}"), BarColumn(),
        TextColumn("{task.completed:>8.0f} / {task.total:.0f} simulated s"), TimeElapsedColumn(),
    )  # fmt: skip


def _hook(progress: Any, task: Any) -> Any:
    def update(now_s: float) -> None:
        progress.update(task, completed=now_s)

    return update


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def run_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from inferplane.sim.plots import render_html
    from inferplane.sim.report import print_summary, to_json

    console = Console(stderr=True)
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else None
    try:
        document, results = simulate(
            args.scenario, seed=args.seed, policies=policies, quiet=args.quiet
        )
    except _user_errors() as exc:
        console.print(f"[red]simulate: {exc}[/red]", highlight=False)
        return 2
    out = args.out or Path(f"sim-{document['scenario']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(to_json(document), encoding="utf-8")
    if not args.no_html:
        (out / "report.html").write_text(render_html(document, results), encoding="utf-8")
    if not args.quiet:
        print_summary(document, Console())
        html_note = "" if args.no_html else f" and {out / 'report.html'}"
        console.print(f"wrote {out / 'result.json'}{html_note}")
    return 0


def plan_command(args: argparse.Namespace) -> int:
    """``inferplane plan plan.yaml``: the cheapest fleet per GPU type, and the sweep."""
    import json

    from rich.console import Console

    from inferplane.sim.plan import PlanError, load_plan, plan_fleets
    from inferplane.sim.plan_report import plan_document, plan_table

    console = Console(stderr=True)
    errors: tuple[type[Exception], ...] = (PlanError, *_user_errors())
    try:
        plan = load_plan(args.plan)
        found = plan_fleets(plan, args.plan.parent)
    except errors as exc:
        console.print(f"[red]plan: {exc}[/red]", highlight=False)
        return 2
    Console().print(plan_table(plan, found))
    if args.out is not None:
        args.out.write_text(json.dumps(plan_document(plan, found), indent=2), encoding="utf-8")
        console.print(f"wrote {args.out}")
    return 0
