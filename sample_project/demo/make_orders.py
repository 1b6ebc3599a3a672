"""Generate the bundled ``orders.csv`` (deterministic): ``python -m sample_project.demo.make_orders``.

A flash sale's traffic: three very hot SKUs take about 40% of the orders, twenty warm SKUs about 35%, and a
long tail of two hundred SKUs the rest; most orders are for one unit, some for two or three.
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

ORDERS_FILE = Path(__file__).with_name("orders.csv")
COUNT = 10_000
SEED = 20_261_130

HOT = ["flash-phone", "flash-console", "flash-sneakers"]
WARM = [f"warm-{i:02d}" for i in range(20)]
TAIL = [f"tail-{i:03d}" for i in range(200)]


def generate(count: int = COUNT, seed: int = SEED) -> list[tuple[str, int]]:
    """Return ``count`` orders as ``(sku, quantity)`` pairs, the same for the same seed."""
    rng = random.Random(seed)
    orders: list[tuple[str, int]] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.40:
            sku = rng.choices(HOT, weights=[5, 3, 2])[0]
        elif roll < 0.75:
            sku = rng.choice(WARM)
        else:
            sku = rng.choice(TAIL)
        quantity = rng.choices([1, 2, 3], weights=[80, 15, 5])[0]
        orders.append((sku, quantity))
    return orders


def write(path: Path, orders: list[tuple[str, int]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["sku", "quantity"])
        writer.writerows(orders)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ORDERS_FILE
    write(target, generate())
    print(f"wrote {COUNT} orders to {target}")
