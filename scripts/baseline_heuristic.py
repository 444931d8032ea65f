"""Mean score of the greedy heuristic (chase the fruit, avoid immediate death) on a board size.

    python scripts/baseline_heuristic.py --size 10 --episodes 2000
"""

from __future__ import annotations

import argparse
import json

from rlperf.env.heuristic import evaluate_heuristic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10)
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = evaluate_heuristic(args.size, args.envs, args.episodes, args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"greedy heuristic on {args.size}x{args.size}: mean score {result['mean_score']:.2f} "
              f"(max {result['max_score']}, mean length {result['mean_length']:.1f}) over {result['episodes']} episodes")


if __name__ == "__main__":
    main()
