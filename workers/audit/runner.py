"""The criterion audit of every requested method on the real model (docs/science.md, section 5)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.audit.checks import GameCheck, check_failure, game_checks
from workers.audit.confidence import BOOTSTRAP_RESAMPLES
from workers.audit.document import GameSection, MethodEntry, Report
from workers.audit.evidence import worst_sets
from workers.audit.judgement import completeness_check, judge_method
from workers.audit.noise import DEFAULT_Z, estimate_floor
from workers.audit.plan import RESOLUTION_PROBES, STOCHASTIC_REPEATS, Plan, audit_plan
from workers.audit.pooling import compact
from workers.audit.report import canonical_bytes, environment, timestamp
from workers.audit.schema import validate_report
from workers.audit.scores import AllocationScores, moebius_shares, score_allocation
from workers.audit.sets import ALL_ORDER_MAX_PLAYERS, AuditedSets, design
from workers.audit.subinputs import SubInputAttributions, attribute_sub_inputs, sub_inputs_from_game
from workers.audit.unaudited import MAX_UNAUDITED_SHARE, unaudited_mass
from workers.audit.verdict import VERDICTS, MethodLevers
from workers.explain import explain, job_params
from workers.game import GameResult, play
from workers.inputs import held_inputs_section
from workers.interactions import interaction_orders, popcounts
from workers.methods import Method, derived_seed, get_method, release_derived
from workers.methods._isolation import judged_alone
from workers.methods.references import choose_references
from workers.players import subset_bits
from workers.prepare import Prepared
from workers.subgames import SubInputGame
from xaudit.contract.errors import NotApplicable
from xaudit.contract.spec import CRITERIA, FOURTEEN_METHODS, tensor_digest

__all__ = [
    "ALL_ORDER_MAX_PLAYERS",
    "MAX_HIDDEN_SHARE",
    "AuditResult",
    "run_audit",
]

logger = logging.getLogger(__name__)

# Most of the effect mass may sit under a method's noise floor; then nothing about its allocation is
# shown and it cannot be judged reliable (raise its steps or samples to lower the floor).
MAX_HIDDEN_SHARE = 0.5
# Sub-inputs (of the first sample) on which a game-derived method is also run on the model, to
# check the derivation against re-evaluation; the largest difference goes into the report.
SPOT_CHECKS = 1
PAPER_CONTEXT_LABEL = "theoretical expectation from Deng et al., TPAMI 2024, Table 1: context for the reader, not used for the verdict"

Progress = Callable[[float, str], None]


@dataclass
class AuditResult:
    report: dict[str, Any]
    report_bytes: bytes
    attributions: dict[str, np.ndarray] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)
    document: Report | None = None  # the typed report that ``report`` is the JSON of
    # Per method, its scores summed over sets (per-sample parts kept): what a data-set audit pools
    # over batches of samples (workers.audit.dataset).
    scores: dict[str, AllocationScores] = field(default_factory=dict)


@dataclass(frozen=True)
class _Measured:
    """One method's sub-input attributions against the game, averaged over its constituents."""

    values: np.ndarray  # (B, m)
    interactions: np.ndarray  # (B, m)
    full: np.ndarray  # (B,) v(N)
    main: SubInputAttributions
    coarse_shift: np.ndarray | None  # (B, k) change of sum_i a_i(x_T) at half resolution
    repeats: np.ndarray | None  # (R, B, m, n)
    evaluations: dict[str, Any]  # how the sub-input attributions were obtained


def _constituents(
    method: Method, prep: Prepared, game: GameResult, background_games: list[tuple[np.ndarray, GameResult]]
) -> list[tuple[np.ndarray, GameResult]]:
    if method.capabilities.baseline != "distribution":
        return [(prep.baselines, game)]
    if not background_games:
        raise NotApplicable(method.name, "it needs a background set of samples (--background)")
    return background_games


def _measure(
    method: Method,
    prep: Prepared,
    game: GameResult,
    background_games: list[tuple[np.ndarray, GameResult]],
    tick: Callable[[], None],
) -> _Measured:
    params = job_params(prep, method.name)
    merged = method.params_from(params)
    parts = _constituents(method, prep, game, background_games)
    subsets = game.subsets

    def run(
        baselines: np.ndarray, run_params: dict[str, Any], seed: int, on: np.ndarray = subsets
    ) -> SubInputAttributions:
        return attribute_sub_inputs(
            method, prep.model, prep.players, prep.target, run_params, seed,
            prep.inputs, baselines, prep.classes, on, tick,
        )  # fmt: skip

    probes = np.random.default_rng(derived_seed(prep.spec.seed, "probes")).permutation(len(subsets))
    probes = np.sort(probes[:RESOLUTION_PROBES])
    mains, coarses, repeats = [], [], []
    derived, deviation, checked = 0, 0.0, np.zeros(0, dtype=np.uint64)
    for c, (baselines, part_game) in enumerate(parts):
        seed = derived_seed(prep.spec.seed, method.name, c)
        sub_game = SubInputGame(prep.players.n, subsets, part_game.values, part_game.interactions)
        from_game = sub_inputs_from_game(method, params, prep.players, sub_game)
        if from_game is None:
            main = run(baselines, params, seed)
        else:
            main, derived = from_game, derived + 1
            if c == 0:
                checked, deviation = _spot_check(method, prep, params, seed, baselines, subsets, main)
        mains.append(main)
        if method.resolution is not None:
            probe_params = dict(params, **{method.resolution: _probe_resolution(method, merged)})
            coarse = run(baselines, probe_params, seed, subsets[probes]).per_player
            coarses.append(coarse.sum(axis=2) - main.per_player[:, probes].sum(axis=2))
        if method.capabilities.stochastic:
            others = [
                run(baselines, params, derived_seed(seed, "repeat", r)).per_player
                for r in range(1, STOCHASTIC_REPEATS)
            ]
            repeats.append(np.stack([main.per_player, *others]))
    main = SubInputAttributions(
        _mean([m.per_player for m in mains]),
        _mean([m.absent_mass for m in mains]),
        _mean([m.total_mass for m in mains]),
    )
    return _Measured(
        values=_mean([g.values for _, g in parts]),
        interactions=_mean([g.interactions for _, g in parts]),
        full=_mean([g.full for _, g in parts]),
        main=main,
        coarse_shift=_mean(coarses) if coarses else None,
        repeats=_mean(repeats) if repeats else None,
        evaluations=_evaluations(prep, parts, derived, checked, deviation),
    )


def _probe_resolution(method: Method, params: dict[str, Any]) -> int:
    """Half the method's resolution, never below what it accepts; where halving is impossible,
    double it (the shift then measures the error of the audited run just as well)."""
    assert method.resolution is not None
    current = int(params[method.resolution])
    probe = max(method.min_resolution(params), current // 2)
    return probe if probe < current else 2 * current


def _spot_check(
    method: Method,
    prep: Prepared,
    params: dict[str, Any],
    seed: int,
    baselines: np.ndarray,
    subsets: np.ndarray,
    derived: SubInputAttributions,
) -> tuple[np.ndarray, float]:
    """Run the method on the model on SPOT_CHECKS sub-inputs of the first sample; the largest
    difference from the game-derived attributions."""
    rng = np.random.default_rng(derived_seed(prep.spec.seed, "spot-check", method.name))
    picks = np.sort(rng.permutation(len(subsets))[:SPOT_CHECKS])
    again = attribute_sub_inputs(
        method, prep.model, prep.players, prep.target, params, seed,
        prep.inputs[:1], baselines[:1], prep.classes[:1], subsets[picks],
    )  # fmt: skip
    return subsets[picks], float(np.abs(again.per_player[0] - derived.per_player[0, picks]).max())


def _evaluations(
    prep: Prepared,
    parts: list[tuple[np.ndarray, GameResult]],
    derived: int,
    checked: np.ndarray,
    deviation: float,
) -> dict[str, Any]:
    """The report's account of where a method's sub-input attributions came from."""
    sub_inputs = len(parts) * parts[0][1].values.size
    if not derived:
        return {"source": "model", "sub_inputs": sub_inputs, "game_values_reused": 0}
    names = prep.players.names
    return {
        "source": "game",
        "sub_inputs": sub_inputs,
        # Each x_T's game is the main game restricted to T: every value it needs was evaluated for the game.
        "game_values_reused": sum(g.values.size for _, g in parts),
        "spot_check": {
            "sets": [[names[i] for i in range(len(names)) if (int(t) >> i) & 1] for t in checked],
            "samples": 1,
            "max_abs_difference": deviation,
        },
    }


def _mean(arrays: list[np.ndarray]) -> np.ndarray:
    """Average over a method's constituents (one per background reference)."""
    return np.mean(np.stack(arrays), axis=0)


def _audit_method(
    method: Method,
    prep: Prepared,
    game: GameResult,
    background_games: list[tuple[np.ndarray, GameResult]],
    order: int,
    failed_checks: list[str],
    tick: Callable[[], None],
    sets: AuditedSets | None = None,
    kept: dict[str, AllocationScores] | None = None,
) -> dict[str, Any]:
    """The measured fields of one method's :class:`MethodEntry`, its verdict among them."""
    measured = _measure(method, prep, game, background_games, tick)
    n, subsets = prep.players.n, game.subsets
    floor = estimate_floor(subsets, measured.values, measured.coarse_shift, measured.repeats, DEFAULT_Z)
    index, survey = (None, None) if sets is None else (sets.family, design(sets))

    def score(per_player: np.ndarray, max_order: int) -> tuple[AllocationScores, np.ndarray]:
        shares = moebius_shares(subsets, per_player, n, index)
        return score_allocation(
            subsets, n, measured.values, measured.interactions,
            per_player, shares, floor.per_set, max_order,
            measured.main.absent_mass, measured.main.total_mass, survey,
        ), shares  # fmt: skip

    scores, shares = score(measured.main.per_player, order)
    if kept is not None:
        kept[method.name] = compact(scores)
    seed_sd: dict[str, float] = {}
    if measured.repeats is not None:
        per_repeat = [score(r, order)[0] for r in measured.repeats]
        seed_sd = {c: float(np.std([s.pooled(c) for s in per_repeat], ddof=1)) for c in CRITERIA}
    tolerances = dict(prep.spec.tolerances)
    unaudited = unaudited_mass(subsets, measured.interactions, measured.full, order, game.exact, game.weights)
    set_sampling_se = {c: scores.sampling_se(c) for c in CRITERIA}
    evidence = worst_sets(scores, subsets, measured.interactions, shares, prep.players, tolerances)
    judgement = judge_method(
        method.name, scores, tolerances, MethodLevers(method.resolution, method.capabilities.stochastic),
        prep.spec.confidence, prep.spec.seed, seed_sd, set_sampling_se, MAX_HIDDEN_SHARE, unaudited,
        failed_checks,
        evidence,
    )  # fmt: skip
    fields: dict[str, Any] = {
        "verdict": judgement.judged.verdict,
        "reason": judgement.judged.reason,
        "failing_criteria": judgement.judged.failing,
        "undecided_criteria": judgement.judged.undecided,
        "criteria": judgement.criteria,
        "completeness_residual": scores.completeness_residual,
        "completeness": completeness_check(
            measured.main.per_player, measured.values, subsets, prep.players.names
        ),
        "out_of_set_share": scores.out_of_set_share,
        "absent_unit_share": scores.absent_share,
        "noise_floor": {
            "z": floor.z,
            "sigma": float(floor.sigma.mean()),
            "rounding_sigma": float(floor.rounding_sigma.mean()),
            "discretisation_sigma": float(floor.discretisation_sigma.mean()),
            "monte_carlo_sigma": float(floor.monte_carlo_sigma.mean()),
            "by_order": floor.per_order(subsets, order),
            "excluded_mass_share": scores.excluded_share,
            "max_excluded_mass_share": MAX_HIDDEN_SHARE,
            "repeats": STOCHASTIC_REPEATS if measured.repeats is not None else 1,
        },
        "by_order": scores.by_order,
        "unaudited": unaudited.section(),
        "evidence": evidence,
        "evaluations": measured.evaluations,
    }
    if game.exact and order < n:
        all_scores = score(measured.main.per_player, n)[0]
        fields["all_orders"] = {
            "noise_amplified": True,
            "note": "every set of every order, for evidence only: alternating sums over 2^|S| sub-inputs amplify noise",
            "scores": {c: all_scores.pooled(c) for c in CRITERIA},
            "by_order": all_scores.by_order,
        }
    return fields


def _game_section(
    prep: Prepared,
    game: GameResult,
    order: int,
    checks: tuple[GameCheck, ...],
    sets: AuditedSets | None = None,
    plan: Plan | None = None,
) -> GameSection:
    players = prep.players
    sizes = popcounts(game.subsets)
    mean_effect = game.interactions.mean(axis=0)
    mean_abs = np.abs(game.interactions).mean(axis=0)
    ranked = [k for k in np.argsort(-mean_abs, kind="stable") if sizes[k] > 0][:10]
    members = [np.flatnonzero(row) for row in subset_bits(game.subsets[ranked], players.n)]
    return GameSection(
        players=[
            {"index": i, "name": name, "size": int(size)}
            for i, (name, size) in enumerate(zip(players.names, players.sizes, strict=True))
        ],
        n=players.n,
        layout=list(players.layout),
        exact=game.exact,
        enumerated_order=game.order,
        audit_order=order,
        classes=game.classes.tolist(),
        target_values=game.full.tolist(),
        reference_values=game.empty.tolist(),
        checks=[c.section() for c in checks],
        unaudited=unaudited_mass(
            game.subsets, game.interactions, game.full, order, game.exact, game.weights
        ).section(),
        mass_by_order=[
            {"order": k, "mass": float(mass)}
            for k, mass in enumerate(
                interaction_orders(
                    game.subsets,
                    game.interactions if game.weights is None else game.interactions * game.weights,
                    game.order,
                ).mean(axis=0),
                1,
            )
        ],
        audited_sets=None if sets is None else sets.section(),
        plan=None if plan is None else plan.section(),
        top_interactions=[
            {
                "set": [players.names[i] for i in mem],
                "members": mem,
                "order": int(sizes[k]),
                "mean_effect": float(mean_effect[k]),
                "mean_abs_effect": float(mean_abs[k]),
                "effects": game.interactions[:, k],
            }
            for k, mem in zip(ranked, members, strict=True)
        ],
    )


def run_audit(prep: Prepared, progress: Progress | None = None, plan: Plan | None = None) -> AuditResult:
    """Audit every method in ``prep.spec.methods``; deterministic under ``prep.spec.seed``.

    ``plan``: the sets to audit, when a caller fixed them for several batches of one data set
    (workers.audit.dataset); by default planned here from the job's spec and budget."""
    report_progress = progress or (lambda fraction, message: None)
    started = time.perf_counter()
    spec, players = prep.spec, prep.players
    order = max(1, min(spec.audit_order, players.n))
    enumerated = players.n if players.n <= ALL_ORDER_MAX_PLAYERS else order
    # Above the all-order limit: the sets of each order up to the audit order, all of them when few,
    # a seeded sample (sized to the job's budget) otherwise, and only their sub-inputs
    # (workers.audit.sets, workers.audit.plan).
    plan = plan or audit_plan(prep)
    sets = plan.sets
    family = None if sets is None else sets.family  # indexed once, played against every reference

    def play_against(baselines: np.ndarray) -> GameResult:
        played = play(
            prep.model,
            prep.inputs,
            baselines,
            players,
            prep.target,
            prep.classes,
            order=enumerated,
            family=family,
        )
        return played if sets is None else dataclasses.replace(played, weights=sets.weights)

    report_progress(0.01, "evaluating the masking game")
    game = play_against(prep.baselines)
    methods = [get_method(name) for name in spec.methods]
    background_games: list[tuple[np.ndarray, GameResult]] = []
    references = None if prep.background is None else choose_references(prep.background, spec.seed)
    if references is not None and any(m.capabilities.baseline == "distribution" for m in methods):
        # Exactly the references the maps average over (workers.methods.references).
        for reference in references.references:
            refs = np.broadcast_to(reference[None], prep.inputs.shape).copy()
            background_games.append((refs, play_against(refs)))
    report_progress(0.05, "attributing the inputs")
    played = SubInputGame(players.n, game.subsets, game.values, game.interactions)
    maps = explain(prep, spec.methods, lambda f, msg: report_progress(0.05 + 0.1 * f, msg), played)
    checks = game_checks(prep, game)
    failed_checks = [check_failure(c.name, c.max_abs_error) for c in checks if not c.passed]
    entries: list[MethodEntry] = []
    kept: dict[str, AllocationScores] = {}
    for k, method in enumerate(methods):
        fraction, message = 0.15 + 0.85 * k / len(methods), f"auditing {method.name}"
        report_progress(fraction, message)
        t0 = time.perf_counter()
        fields: dict[str, Any]
        if method.name in maps.not_applicable:
            fields = {"verdict": "not_applicable", "reason": maps.not_applicable[method.name]}
        else:
            try:
                tick = functools.partial(report_progress, fraction, message)
                with judged_alone(method.name):
                    fields = _audit_method(
                        method, prep, game, background_games, order, failed_checks, tick, sets, kept
                    )
            except NotApplicable as exc:
                fields = {"verdict": "not_applicable", "reason": exc.reason}
            release_derived()  # one method's derived weights at a time, as explain() keeps them
        if fields["verdict"] != "not_applicable":
            fields["implementation"] = method.described_implementation(prep.model)
        if method.capabilities.baseline == "distribution" and references is not None:
            fields["references"] = {
                "given": references.given,
                "used": references.used,
                "sampled": references.sampled,
                "note": (
                    f"a seeded sample of {references.used} of {references.given} background samples, "
                    "the same for the map and the audit"
                    if references.sampled
                    else "every background sample, for the map and the audit"
                ),
            }
        entry = MethodEntry(
            name=method.name,
            among_fourteen=method.name in FOURTEEN_METHODS,
            capabilities={
                "gradients": method.capabilities.gradients,
                "hooks": method.capabilities.hooks,
                "baseline": method.capabilities.baseline,
                "stochastic": method.capabilities.stochastic,
            },
            paper_context={"label": PAPER_CONTEXT_LABEL, "text": method.paper_context},
            seconds=maps.seconds.get(method.name, 0.0) + time.perf_counter() - t0,
            **fields,
        )
        entries.append(entry)
        logger.info("%s: %s (%.1fs)", method.name, entry.verdict, entry.seconds)
    document = Report(
        created=timestamp(),
        model={
            "sha256": prep.model.info.sha256,
            "format": prep.model.info.format,
            "input_name": prep.model.info.input_name,
            "output_name": prep.model.info.output_name,
        },
        inputs={
            "sha256": tensor_digest(prep.inputs),
            "shape": list(prep.inputs.shape),
            "count": len(prep.inputs),
            **held_inputs_section(prep.model),
        },
        config={
            "players": spec.players,
            "baseline": spec.baseline,
            "target": spec.target,
            "methods": [
                # As used: with the parameters fixed per job (e.g. Deep Taylor's bounds) filled in.
                {"name": m.name, "params": m.params_from(job_params(prep, m.name))}
                for m in methods
            ],
            "audit_order": order,
            "tolerances": dict(spec.tolerances),
            "seed": spec.seed,
            "noise_z": DEFAULT_Z,
            "background_samples": len(background_games),
            "background_given": 0 if references is None else references.given,
            "stochastic_repeats": STOCHASTIC_REPEATS,
            "confidence": {"level": spec.confidence, "bootstrap_resamples": BOOTSTRAP_RESAMPLES},
            "max_unaudited_share": MAX_UNAUDITED_SHARE,
        },
        environment=environment(str(prep.model.device), prep.model.execution_providers),
        game=_game_section(prep, game, order, checks, sets, plan),
        methods=entries,
        summary={verdict: [e.name for e in entries if e.verdict == verdict] for verdict in VERDICTS},
        seconds=time.perf_counter() - started,
    )
    report_progress(1.0, "audit done")
    report = document.to_json()
    # A report that fails its own schema is a bug: it is never written, signed or returned.
    validate_report(report)
    return AuditResult(
        report, canonical_bytes(report), maps.attributions, maps.not_applicable, document, kept
    )
