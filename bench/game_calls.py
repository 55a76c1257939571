"""The digits game by rows per call: raw onnxruntime under each cuDNN algorithm search, and the game
with its rows built on the device against the host's half tables.

    python -m bench.game_calls [--repeats 5] [--device cuda]

The probe behind two choices (README, GPU): onnxruntime's CUDA convolutions take cuDNN's heuristics
(workers/precision.py), and a game of several calls builds its rows on the GPU while a game of one
call keeps the host's half tables (workers/game.py). Prints milliseconds per game (median of
repeats after two warm-up calls), for the 16-player game (65,536 rows, one sample) and the 8-player
one (1,024 rows, four samples). Without a GPU it runs on the CPU, where the algorithm search does
not apply and the device rows are never taken.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import partial

import numpy as np

from bench._common import median_seconds

ROWS_PER_CALL = (1024, 4096, 16384, 17408, 32768, 65536)
SEARCHES = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")


def _ms(fn: Callable[[], object], repeats: int) -> float:
    return median_seconds(fn, repeats, warmup=2) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    args = parser.parse_args()
    os.environ.setdefault("XAUDIT_THREADS", "1")

    from bench.suite import _digits

    data, inputs, _ = _digits()
    for grid, samples in (("grid:4x4", 1), ("grid:2x4", 4)):
        _probe(data, inputs[:samples], grid, args.device, args.repeats)


def _probe(data: bytes, x: np.ndarray, grid: str, device: str, repeats: int) -> None:
    import onnxruntime as ort

    import workers.game as game
    from workers.device_rows import GameRows
    from workers.interactions import subsets_up_to
    from workers.models import load_model
    from workers.models.ort_options import session_options
    from workers.players import parse_players, subset_bits
    from workers.precision import CUDA_PROVIDER_OPTIONS
    from workers.sub_inputs import masked_samples
    from workers.targets import parse_target

    model = load_model(data, "onnx", device)
    cuda = model.device.type == "cuda"
    players, target = parse_players(grid, x.shape[1:]), parse_target("predicted")
    classes = target.resolve_classes(model.predict(x))
    base = np.zeros_like(x)
    masked = masked_samples(subset_bits(subsets_up_to(players.n, players.n), players.n), x, base, players)
    sizes = [rows for rows in ROWS_PER_CALL if rows <= len(masked)] or [len(masked)]
    searches = SEARCHES if cuda else ("cpu",)
    print(f"## {players.n} players, {len(masked):,} rows ({model.execution_providers[0]})")
    print()
    print("| rows per call | " + " | ".join(f"raw ORT, {s} ms" for s in searches) + " |")
    print("|---:|" + "---:|" * len(searches))
    sessions = []
    for search in searches:
        providers: list[str | tuple[str, dict[str, str]]] = ["CPUExecutionProvider"]
        if cuda:
            providers.insert(
                0, ("CUDAExecutionProvider", {**CUDA_PROVIDER_OPTIONS, "cudnn_conv_algo_search": search})
            )
        options = session_options()
        sessions.append(ort.InferenceSession(data, sess_options=options, providers=providers))
    name = sessions[0].get_inputs()[0].name

    def raw(session: ort.InferenceSession, rows: int) -> Callable[[], None]:
        def run() -> None:
            for start in range(0, len(masked), rows):
                session.run(None, {name: masked[start : start + rows]})

        return run

    for rows in sizes:
        cells = [f"{_ms(raw(session, rows), repeats):.2f}" for session in sessions]
        print(f"| {rows:,} | " + " | ".join(cells) + " |", flush=True)
    print()
    print("| rows per call | game, device rows ms | game, host half tables ms |")
    print("|---:|---:|---:|")

    def play() -> None:
        game.play(model, x, base, players, target, classes)

    chosen = game._rows_on_device
    for rows in sizes:
        model.rows_per_call = partial(_fixed, rows)  # type: ignore[method-assign]
        try:  # each path forced, whatever the game would choose for this many calls
            game._rows_on_device = lambda model, players, bits, calls: GameRows(players, bits, model.device)
            on_device = _ms(play, repeats) if cuda else float("nan")
            game._rows_on_device = lambda model, players, bits, calls: None
            host = _ms(play, repeats)
        finally:
            game._rows_on_device = chosen
        print(f"| {rows:,} | {on_device:.2f} | {host:.2f} |", flush=True)
    print()


def _fixed(rows: int, elements: int) -> int:
    return rows


if __name__ == "__main__":
    main()
